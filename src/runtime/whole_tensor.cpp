// Inter-tensor ZeRO-3: the partitioner, the placement and whole_tensor_shard. See
// include/fsdp/runtime/whole_tensor.h; the unit's collectives are whole_tensor_unsharder.cpp (the
// broadcasts) and gradient_reducer.cpp (the reduces).
//
// The partition is a pure function of the items' sizes, units and order, so every rank computes
// the same one without communicating.
#include <fsdp/runtime/whole_tensor.h>

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <numeric>
#include <set>
#include <unordered_map>
#include <unordered_set>

namespace fsdp {
namespace {

void check_items(const std::vector<WholeTensorItem>& items, int world,
                 const WholeTensorPartitionOptions& options) {
  TORCH_CHECK(world >= 1, "partition_whole_tensors: the world size must be at least 1, got ",
              world);
  const double p = options.evenness_priority();
  TORCH_CHECK(p >= 0 && p <= 1,
              "partition_whole_tensors: evenness_priority must be in [0, 1], got ", p);
  for (const auto& item : items) {
    TORCH_CHECK(item.bytes >= 0 && item.unit >= 0, "partition_whole_tensors: tensor '", item.name,
                "' has ", item.bytes, " bytes in unit ", item.unit, "; both must be non-negative");
  }
}

// Largest first; ties in unit order, then item order.
std::vector<size_t> placement_order(const std::vector<WholeTensorItem>& items) {
  std::vector<size_t> order(items.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (items[a].bytes != items[b].bytes) return items[a].bytes > items[b].bytes;
    return items[a].unit < items[b].unit;
  });
  return order;
}

// The least loaded of ranks (the lowest on ties).
template <typename Ranks>
int least_loaded(const Ranks& ranks, const std::vector<int64_t>& load) {
  int best = -1;
  for (const int r : ranks) {
    if (best < 0 || load[r] < load[best]) best = r;
  }
  return best;
}

}  // namespace

int64_t WholeTensorPartition::total_bytes() const {
  return std::accumulate(rank_bytes.begin(), rank_bytes.end(), int64_t{0});
}

double WholeTensorPartition::imbalance() const {
  const int64_t total = total_bytes();
  if (total == 0 || rank_bytes.empty()) return 1.0;
  const int64_t most = *std::max_element(rank_bytes.begin(), rank_bytes.end());
  return static_cast<double>(most) * static_cast<double>(rank_bytes.size()) /
         static_cast<double>(total);
}

std::string WholeTensorPartition::describe() const {
  std::string bytes;
  for (const int64_t b : rank_bytes) bytes += (bytes.empty() ? "" : ", ") + std::to_string(b);
  return fmt::format(
      "bytes per rank {}; imbalance {:.3f} (largest / mean); {} broadcasts per "
      "gather of every unit",
      bytes, imbalance(), unit_owner_pairs);
}

WholeTensorPartition partition_whole_tensors(const std::vector<WholeTensorItem>& items, int world,
                                             const WholeTensorPartitionOptions& options) {
  check_items(items, world, options);
  WholeTensorPartition result;
  result.owners.assign(items.size(), 0);
  result.rank_bytes.assign(static_cast<size_t>(world), 0);
  int64_t total = 0;
  for (const auto& item : items) total += item.bytes;
  const double p = options.evenness_priority();
  const double limit = (2.0 - p) * static_cast<double>(total) / world;
  std::vector<int> all_ranks(static_cast<size_t>(world));
  std::iota(all_ranks.begin(), all_ranks.end(), 0);
  std::unordered_map<int, std::set<int>> unit_owners;
  for (const size_t i : placement_order(items)) {
    const WholeTensorItem& item = items[i];
    std::set<int>& owners = unit_owners[item.unit];
    int rank = least_loaded(all_ranks, result.rank_bytes);
    if (p < 1 && !owners.empty()) {
      const int joined = least_loaded(owners, result.rank_bytes);
      if (static_cast<double>(result.rank_bytes[joined] + item.bytes) <= limit) rank = joined;
    }
    result.owners[i] = rank;
    result.rank_bytes[rank] += item.bytes;
    owners.insert(rank);
  }
  for (const auto& [unit, owners] : unit_owners) result.unit_owner_pairs += owners.size();
  return result;
}

void WholeTensorPlacement::set_owner(const at::Tensor& param, int rank) {
  TORCH_CHECK(param.defined(), "WholeTensorPlacement: the parameter is undefined");
  TORCH_CHECK(rank >= 0, "WholeTensorPlacement: owner rank must be non-negative, got ", rank);
  owners_[param.unsafeGetTensorImpl()] = rank;
}

int WholeTensorPlacement::owner_of(const at::Tensor& param) const {
  auto it = owners_.find(param.unsafeGetTensorImpl());
  return it == owners_.end() ? -1 : it->second;
}

namespace {

// Checks units and maps each of their tensors to its unit's index; the root's are not listed.
std::unordered_map<const c10::TensorImpl*, int> units_of_tensors(
    const torch::nn::Module& model, const std::vector<std::shared_ptr<torch::nn::Module>>& units) {
  std::unordered_set<const torch::nn::Module*> in_model;
  for (const auto& m : model.modules()) in_model.insert(m.get());
  std::unordered_map<const torch::nn::Module*, size_t> unit_index;
  for (size_t u = 0; u < units.size(); ++u) {
    TORCH_CHECK(units[u] != nullptr, "whole_tensor_shard: unit ", u, " is null");
    TORCH_CHECK(in_model.count(units[u].get()) != 0, "whole_tensor_shard: unit ", u, " ('",
                units[u]->name(), "') is not a module of the model");
    TORCH_CHECK(units[u].get() != &model, "whole_tensor_shard: unit ", u,
                " is the model itself, which is always the root unit");
    unit_index.emplace(units[u].get(), u);
  }
  std::unordered_map<const c10::TensorImpl*, int> unit_of;
  for (size_t u = 0; u < units.size(); ++u) {
    for (const auto& m : units[u]->modules(/*include_self=*/false)) {
      auto inner = unit_index.find(m.get());
      TORCH_CHECK(inner == unit_index.end(), "whole_tensor_shard: unit ", inner->second,
                  " lies inside unit ", u, "; units must not contain each other");
    }
    for (const auto& p : unique_parameters(*units[u])) {
      unit_of.emplace(p.unsafeGetTensorImpl(), static_cast<int>(u));
    }
  }
  return unit_of;
}

}  // namespace

WholeTensorSharding whole_tensor_shard(const std::shared_ptr<torch::nn::Module>& model,
                                       const std::vector<std::shared_ptr<torch::nn::Module>>& units,
                                       const DeviceMesh& mesh,
                                       const WholeTensorShardOptions& options) {
  TORCH_CHECK(model != nullptr, "whole_tensor_shard: model is null");
  TORCH_CHECK(mesh.ndim() == 1, "whole_tensor_shard: the mesh is 2-D (", mesh.replicate_size(),
              " x ", mesh.shard_size(), "); inter-tensor ZeRO-3 needs a 1-D mesh");
  const auto unit_of = units_of_tensors(*model, units);
  const int root_unit = static_cast<int>(units.size());
  std::vector<WholeTensorItem> items;
  std::vector<at::Tensor> tensors;
  std::vector<std::string> names;
  for (auto& [name, p] : unique_named_parameters(*model)) {
    auto it = unit_of.find(p.unsafeGetTensorImpl());
    items.push_back(
        {name, static_cast<int64_t>(p.nbytes()), it == unit_of.end() ? root_unit : it->second});
    tensors.push_back(p);
    names.push_back(name);
  }
  WholeTensorPartition partition =
      partition_whole_tensors(items, mesh.shard_size(), options.partition());
  auto placement = std::make_shared<WholeTensorPlacement>();
  for (size_t i = 0; i < tensors.size(); ++i) placement->set_owner(tensors[i], partition.owners[i]);
  FullyShardOptions unit_options = options.unit_options();
  unit_options.whole_tensor(placement);
  for (const auto& unit : units) fully_shard(unit, mesh, unit_options);
  // The root reports where its blocks do.
  FSDPModule root = fully_shard(model, mesh,
                                FullyShardOptions()
                                    .mp_policy(options.root_mp_policy())
                                    .whole_tensor(placement)
                                    .observer(unit_options.observer()));
  return WholeTensorSharding{root, std::move(partition), std::move(names)};
}

}  // namespace fsdp
