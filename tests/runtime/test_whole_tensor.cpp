// Inter-tensor ZeRO-3 (fsdp/runtime/whole_tensor.h):
// - the partitioner against a brute-force optimum and its own bounds, the imbalance it reports
//   against the owners it returns, and what evenness_priority trades;
// - GPT-2 (tiny) trained whole-tensor over W = 2, 3, 4 thread-ranks against the single process
//   (losses, gradient norms and every parameter on its owner within 1e-5), W = 1 bit-identical;
// - the accounting: a rank's parameters, gradients and AdamW state are exactly the bytes the
//   partition gave it, and one step's broadcast and reduce payloads and calls are the counts
//   derived from the partition and the units' sizes;
// - bad placements and options refused with the values named.
#include "support/gpt_case.h"
#include "support/harness.h"
#include "support/test_support.h"

#include <fsdp/runtime/whole_tensor.h>
#include <models/gpt2/gpt2.h>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>

namespace fsdp::test {
namespace {

using models::GPT2Config;
using models::GPT2LMHead;
using models::GPT2LMHeadImpl;
using models::GPT2Options;
using ::testing::HasSubstr;

// ---- The partitioner ----

int64_t max_of(const std::vector<int64_t>& v) { return *std::max_element(v.begin(), v.end()); }

// The smallest achievable largest load, by trying every assignment.
int64_t brute_force_optimum(const std::vector<int64_t>& sizes, int world) {
  int64_t best = std::numeric_limits<int64_t>::max();
  std::vector<int> owner(sizes.size(), 0);
  while (true) {
    std::vector<int64_t> load(world, 0);
    for (size_t i = 0; i < sizes.size(); ++i) load[owner[i]] += sizes[i];
    best = std::min(best, max_of(load));
    size_t k = 0;
    while (k < owner.size() && ++owner[k] == world) owner[k++] = 0;
    if (k == owner.size()) return best;
  }
}

std::vector<WholeTensorItem> items_of(const std::vector<int64_t>& sizes, int units = 1) {
  std::vector<WholeTensorItem> items;
  for (size_t i = 0; i < sizes.size(); ++i) {
    items.push_back({"t" + std::to_string(i), sizes[i], static_cast<int>(i) % units});
  }
  return items;
}

// The partition's own report agrees with its owners.
void expect_consistent(const std::vector<WholeTensorItem>& items, const WholeTensorPartition& p,
                       int world) {
  ASSERT_EQ(p.owners.size(), items.size());
  std::vector<int64_t> load(world, 0);
  std::set<std::pair<int, int>> pairs;
  for (size_t i = 0; i < items.size(); ++i) {
    ASSERT_GE(p.owners[i], 0);
    ASSERT_LT(p.owners[i], world);
    load[p.owners[i]] += items[i].bytes;
    pairs.insert({items[i].unit, p.owners[i]});
  }
  EXPECT_EQ(p.rank_bytes, load);
  EXPECT_EQ(p.unit_owner_pairs, static_cast<int64_t>(pairs.size()));
  const double mean = static_cast<double>(p.total_bytes()) / world;
  EXPECT_DOUBLE_EQ(p.imbalance(), static_cast<double>(max_of(load)) / mean);
}

TEST(WholeTensorPartition, GreedyLargestFirstIsWithinGrahamsBoundOfTheOptimum) {
  std::mt19937 gen(7);
  for (int trial = 0; trial < 40; ++trial) {
    const int world = 2 + trial % 3;
    std::vector<int64_t> sizes(7 + trial % 2);
    for (auto& s : sizes) s = 1 + static_cast<int64_t>(gen() % 100);
    const auto items = items_of(sizes, 3);
    const WholeTensorPartition p = partition_whole_tensors(items, world);
    expect_consistent(items, p, world);
    // Largest-first list scheduling: at most (4/3 - 1/(3W)) of the optimum (Graham, 1969).
    const double opt = static_cast<double>(brute_force_optimum(sizes, world));
    EXPECT_LE(static_cast<double>(max_of(p.rank_bytes)), (4.0 / 3 - 1.0 / (3 * world)) * opt)
        << "trial " << trial;
  }
}

TEST(WholeTensorPartition, EqualTensorsSpreadEvenlyAndLargestGoFirst) {
  // 8 equal tensors on 4 ranks: two each, imbalance exactly 1.
  const auto even = partition_whole_tensors(items_of(std::vector<int64_t>(8, 10)), 4);
  EXPECT_EQ(even.rank_bytes, std::vector<int64_t>(4, 20));
  EXPECT_DOUBLE_EQ(even.imbalance(), 1.0);
  // One tensor larger than all others together: it stands alone; the imbalance is reported.
  const auto items = items_of({5, 100, 5, 5, 5});
  const auto skewed = partition_whole_tensors(items, 2);
  expect_consistent(items, skewed, 2);
  EXPECT_EQ(max_of(skewed.rank_bytes), 100);
  EXPECT_DOUBLE_EQ(skewed.imbalance(), 100.0 / 60.0);
  EXPECT_THAT(skewed.describe(), HasSubstr("imbalance 1.667"));
  // More ranks than tensors: some own nothing, none owns two.
  const auto sparse = partition_whole_tensors(items_of({3, 2}), 4);
  EXPECT_EQ(std::count(sparse.rank_bytes.begin(), sparse.rank_bytes.end(), 0), 2);
}

// GPT-2 small's tensors, one unit per block plus the root, in named_parameters() order.
std::vector<WholeTensorItem> gpt2_items(const GPT2Config& config) {
  GPT2LMHead model(GPT2Options(config).seed(1));
  std::map<const c10::TensorImpl*, int> unit_of;
  for (size_t b = 0; b < model->transformer->blocks.size(); ++b) {
    for (const auto& p : model->transformer->blocks[b]->parameters()) {
      unit_of[p.unsafeGetTensorImpl()] = static_cast<int>(b);
    }
  }
  std::vector<WholeTensorItem> items;
  for (const auto& [name, p] : unique_named_parameters(*model)) {
    auto it = unit_of.find(p.unsafeGetTensorImpl());
    items.push_back({name, static_cast<int64_t>(p.nbytes()),
                     it == unit_of.end() ? static_cast<int>(config.n_layer) : it->second});
  }
  return items;
}

TEST(WholeTensorPartition, LowerEvennessPriorityTradesBalanceForFewerBroadcasts) {
  GPT2Config config = GPT2Config::tiny();
  config.n_layer = 6;
  config.n_embd = 64;
  const auto items = gpt2_items(config);
  int64_t largest = 0;
  for (const auto& item : items) largest = std::max(largest, item.bytes);
  for (const int world : {2, 4}) {
    std::vector<WholeTensorPartition> by_priority;
    for (const double p : {1.0, 0.5, 0.0}) {
      const auto part =
          partition_whole_tensors(items, world, WholeTensorPartitionOptions().evenness_priority(p));
      expect_consistent(items, part, world);
      // A tensor joins a rank of its unit only within (2 - p) x the mean; otherwise it goes to
      // the least loaded rank, which holds at most the mean.
      const double mean = static_cast<double>(part.total_bytes()) / world;
      EXPECT_LE(static_cast<double>(max_of(part.rank_bytes)),
                std::max((2 - p) * mean, mean + static_cast<double>(largest)))
          << "W " << world << " priority " << p;
      by_priority.push_back(part);
    }
    // Fewer owners per unit at 0 than at 1, and no better balance.
    EXPECT_LT(by_priority[2].unit_owner_pairs, by_priority[0].unit_owner_pairs) << "W " << world;
    EXPECT_GE(by_priority[2].imbalance(), by_priority[0].imbalance()) << "W " << world;
  }
}

TEST(WholeTensorPartition, IsDeterministicAndRefusesBadInput) {
  const auto items = items_of({4, 9, 1, 9, 3}, 2);
  EXPECT_EQ(partition_whole_tensors(items, 3).owners, partition_whole_tensors(items, 3).owners);
  EXPECT_THAT(error_message([&] { partition_whole_tensors(items, 0); }),
              HasSubstr("world size must be at least 1, got 0"));
  EXPECT_THAT(error_message([&] {
                partition_whole_tensors(items, 2,
                                        WholeTensorPartitionOptions().evenness_priority(1.5));
              }),
              HasSubstr("evenness_priority must be in [0, 1], got 1.5"));
  EXPECT_THAT(error_message([] {
                partition_whole_tensors({{"w", -4, 0}}, 2);
              }),
              HasSubstr("tensor 'w' has -4 bytes"));
}

// ---- Training against the single process ----

struct WholeCaseOptions {
  double evenness_priority = 1.0;
  MixedPrecisionPolicy mp_policy;
  int accumulation = 1;
  bool no_sync = false;  // accumulate without reducing until the last micro-batch
  int prefetch = 1;
};

// The tiny GPT-2 built whole, then sharded whole-tensor (blocks as units, then the root).
TrainCase whole_case(const WholeCaseOptions& opt = {}) {
  GptCaseOptions base;
  base.deferred = false;
  base.accumulation = opt.accumulation;
  base.mp_policy = opt.mp_policy;
  TrainCase c = gpt_case(base);
  c.shard = [opt](const std::shared_ptr<torch::nn::Module>& m, const DeviceMesh& mesh) {
    auto model = std::static_pointer_cast<GPT2LMHeadImpl>(m);
    std::vector<std::shared_ptr<torch::nn::Module>> units;
    for (auto& block : model->transformer->blocks) units.push_back(block.ptr());
    const auto options =
        WholeTensorShardOptions()
            .partition(WholeTensorPartitionOptions().evenness_priority(opt.evenness_priority))
            .unit_options(FullyShardOptions().mp_policy(opt.mp_policy))
            .root_mp_policy(opt.mp_policy);
    whole_tensor_shard(m, units, mesh, options).root.set_implicit_prefetch(opt.prefetch);
  };
  if (opt.no_sync) {
    const int last = opt.accumulation - 1;
    c.before_micro_batch = [last](const std::shared_ptr<torch::nn::Module>& m, int micro) {
      fsdp_module_of(*m)->set_requires_gradient_sync(micro == last);
    };
  }
  return c;
}

// Losses and norms within rel_tol on every rank; each parameter held whole by exactly one rank
// (empty on the others) and within abs_tol of the reference there.
void expect_whole_equivalent(const TrainRecord& reference, const std::vector<TrainRecord>& ranks,
                             double rel_tol, double abs_tol) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    ASSERT_EQ(ranks[r].losses.size(), reference.losses.size());
    for (size_t s = 0; s < reference.losses.size(); ++s) {
      EXPECT_NEAR(ranks[r].losses[s], reference.losses[s], rel_tol * reference.losses[s])
          << "loss, rank " << r << " step " << s;
      EXPECT_NEAR(ranks[r].grad_norms[s], reference.grad_norms[s],
                  rel_tol * reference.grad_norms[s])
          << "grad norm, rank " << r << " step " << s;
    }
  }
  for (const auto& [name, want] : reference.params) {
    int owners = 0;
    for (size_t r = 0; r < ranks.size(); ++r) {
      const at::Tensor& local = ranks[r].params.at(name);
      const ShardMetadata& m = ranks[r].metadata.at(name);
      if (local.numel() == 0) {
        EXPECT_EQ(m.local_rows, 0) << name << " rank " << r;
        continue;
      }
      ++owners;
      EXPECT_EQ(m.local_rows, want.dim() == 0 ? 1 : want.size(0)) << name;
      EXPECT_LE((local.reshape(want.sizes()) - want).abs().max().item<double>(), abs_tol)
          << "parameter " << name << " on its owner, rank " << r;
    }
    EXPECT_EQ(owners, 1) << "parameter " << name << " has " << owners << " owners";
  }
}

TEST(WholeTensorEquivalence, OneRankIsBitIdenticalToNoFsdp) {
  const TrainCase c = whole_case();
  expect_bit_identical(train_reference(c), train_sharded(c, 1)[0]);
}

class WholeTensorEquivalenceW : public ::testing::TestWithParam<int> {};

TEST_P(WholeTensorEquivalenceW, MatchesSingleProcess) {
  const TrainCase c = whole_case();
  expect_whole_equivalent(train_reference(c), train_sharded(c, GetParam()), 1e-5, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(World, WholeTensorEquivalenceW, ::testing::Values(2, 3, 4));

TEST(WholeTensorEquivalence, EvennessPriorityZeroAndNoPrefetch) {
  WholeCaseOptions opt;
  opt.evenness_priority = 0;
  opt.prefetch = 0;
  const TrainCase c = whole_case(opt);
  expect_whole_equivalent(train_reference(c), train_sharded(c, 3), 1e-5, 1e-5);
}

TEST(WholeTensorEquivalence, GradientAccumulationWithAndWithoutSync) {
  for (const bool no_sync : {false, true}) {
    WholeCaseOptions opt;
    opt.accumulation = 2;
    opt.no_sync = no_sync;
    const TrainCase c = whole_case(opt);
    SCOPED_TRACE(no_sync ? "no sync" : "sync");
    expect_whole_equivalent(train_reference(c), train_sharded(c, 2), 1e-5, 1e-5);
  }
}

// Shard(0) records of every rank put back together: each parameter's rows, in rank order.
TrainRecord assembled(const std::vector<TrainRecord>& ranks) {
  TrainRecord whole = ranks[0];
  for (auto& [name, t] : whole.params) {
    std::vector<at::Tensor> rows;
    for (const auto& r : ranks) {
      const ShardMetadata& m = r.metadata.at(name);
      rows.push_back(r.params.at(name).reshape({m.padded_rows, -1}).narrow(0, 0, m.local_rows));
    }
    t = at::cat(rows).reshape(ranks[0].metadata.at(name).global_shape);
  }
  return whole;
}

TEST(WholeTensorEquivalence, Bf16ComputeMatchesFullShardsBf16) {
  // full_shard's bf16 runs are checked against a single process in test_training_modes.cpp; the
  // same casts and fp32 reductions (a sum of two) in whole tensors must give the same numbers.
  // Without clipping: the clip coefficient depends on how the norm's sum is grouped, and a
  // last-bit difference in a master weight can flip its bf16 copy's rounding, which AdamW then
  // amplifies in gradients that are mathematically zero (c_attn's key bias).
  GptCaseOptions shard_options;
  shard_options.deferred = false;
  shard_options.mp_policy.param_dtype(at::kBFloat16).reduce_dtype(at::kFloat);
  WholeCaseOptions whole_options;
  whole_options.mp_policy = shard_options.mp_policy;
  TrainCase sharded = gpt_case(shard_options), whole = whole_case(whole_options);
  sharded.max_grad_norm = whole.max_grad_norm = std::numeric_limits<double>::infinity();
  const TrainRecord full_shard = assembled(train_sharded(sharded, 2));
  expect_whole_equivalent(full_shard, train_sharded(whole, 2), 1e-6, 1e-7);
}

// ---- Accounting ----

int64_t bytes_of(const std::vector<at::Tensor>& tensors) {
  int64_t n = 0;
  for (const auto& t : tensors) n += t.defined() ? static_cast<int64_t>(t.nbytes()) : 0;
  return n;
}

TEST(WholeTensorAccounting, StateIsTheOwnedBytesAndPayloadsAreTheAnalyticCounts) {
  constexpr int kWorld = 3;
  const TrainCase c = whole_case();
  run_ranks_in_threads(
      kWorld,
      [&](std::shared_ptr<ProcessGroup> group) {
        const int rank = group->rank();
        DeviceMesh mesh(group);
        auto model = std::static_pointer_cast<GPT2LMHeadImpl>(c.make_model(&mesh));
        std::vector<std::shared_ptr<torch::nn::Module>> units;
        for (auto& block : model->transformer->blocks) units.push_back(block.ptr());
        // Each unit's bytes, from the model before sharding; its owners, from the partition.
        std::map<const c10::TensorImpl*, int> unit_of;
        for (size_t u = 0; u < units.size(); ++u) {
          for (const auto& p : units[u]->parameters()) {
            unit_of[p.unsafeGetTensorImpl()] = static_cast<int>(u);
          }
        }
        std::vector<int> unit_of_item;
        std::vector<int64_t> unit_bytes(units.size() + 1, 0);
        for (const auto& [name, p] : unique_named_parameters(*model)) {
          auto it = unit_of.find(p.unsafeGetTensorImpl());
          unit_of_item.push_back(it == unit_of.end() ? static_cast<int>(units.size()) : it->second);
          unit_bytes[unit_of_item.back()] += static_cast<int64_t>(p.nbytes());
        }
        // The root reports to the blocks' observer too.
        const auto monitor = std::make_shared<RankMonitor>();
        const auto sharding = whole_tensor_shard(
            model, units, mesh,
            WholeTensorShardOptions().unit_options(FullyShardOptions().observer(monitor)));
        std::vector<std::set<int>> unit_owners(units.size() + 1);
        for (size_t i = 0; i < unit_of_item.size(); ++i) {
          unit_owners[unit_of_item[i]].insert(sharding.partition.owners[i]);
        }
        const int64_t owned = sharding.partition.rank_bytes[rank];
        int64_t sharded = 0;
        for (const FSDPModule& unit : fsdp_modules_under(*model))
          sharded += unit.sharded_param_bytes();
        EXPECT_EQ(sharded, owned);

        auto params = unique_parameters(*model);
        EXPECT_EQ(bytes_of(params), owned);
        torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(1e-3));
        for (int step = 0; step < 2; ++step) {
          if (step == 1) mesh.reset_counters();
          optimizer.zero_grad();
          auto [inputs, targets] = c.batch(step);
          const int64_t rows = inputs.size(0) / kWorld;
          c.loss(model, inputs.narrow(0, rank * rows, rows), targets.narrow(0, rank * rows, rows))
              .backward();
          optimizer.step();
        }
        const CommCounters counters = mesh.counters();
        // Blocks gather in forward and again in backward; the root keeps its tensors between.
        int64_t broadcast = unit_bytes.back(), reduce = 0, broadcasts = unit_owners.back().size();
        int64_t reduces = 0;
        for (size_t u = 0; u < unit_bytes.size(); ++u) {
          reduce += unit_bytes[u];
          reduces += unit_owners[u].size();
          if (u < units.size()) {
            broadcast += 2 * unit_bytes[u];
            broadcasts += 2 * unit_owners[u].size();
          }
        }
        EXPECT_EQ(counters.broadcast.payload_bytes, broadcast) << "rank " << rank;
        EXPECT_EQ(counters.broadcast.calls, broadcasts) << "rank " << rank;
        EXPECT_EQ(counters.reduce.payload_bytes, reduce) << "rank " << rank;
        EXPECT_EQ(counters.reduce.calls, reduces) << "rank " << rank;
        EXPECT_EQ(counters.all_gather.calls, 0);
        EXPECT_EQ(counters.reduce_scatter.calls, 0);
        EXPECT_EQ(sharding.partition.unit_owner_pairs, reduces);
        // Gradients and AdamW state: the owned tensors, nothing of the others.
        std::vector<at::Tensor> grads, state;
        for (const auto& p : params) grads.push_back(p.grad());
        for (const auto& [key, s] : optimizer.state()) {
          const auto& adam = static_cast<const torch::optim::AdamWParamState&>(*s);
          state.push_back(adam.exp_avg());
          state.push_back(adam.exp_avg_sq());
        }
        EXPECT_EQ(bytes_of(grads), owned);
        EXPECT_EQ(bytes_of(state), 2 * owned);
        // Between steps no tensor of another owner is held.
        EXPECT_EQ(sharding.root.observer(), monitor);
        EXPECT_EQ(monitor->stats().live().unsharded_param_bytes, 0);
        EXPECT_EQ(monitor->stats().live().comm_buffer_bytes, 0);
      },
      test_options());
}

// ---- Errors ----

TEST(WholeTensorErrors, APlacementMissingAParameterOrOutsideTheMeshIsRefused) {
  run_ranks_in_threads(
      4,
      [](std::shared_ptr<ProcessGroup> group) {
        DeviceMesh mesh(group);
        auto lin = torch::nn::Linear(4, 3);
        auto placement = std::make_shared<WholeTensorPlacement>();
        placement->set_owner(lin->weight, 0);
        EXPECT_THAT(error_message([&] {
                      fully_shard(lin, mesh, FullyShardOptions().whole_tensor(placement));
                    }),
                    HasSubstr("parameter 'bias' of module 'torch::nn::LinearImpl' has no owner"));
        placement->set_owner(lin->bias, 5);
        EXPECT_THAT(error_message([&] {
                      fully_shard(lin, mesh, FullyShardOptions().whole_tensor(placement));
                    }),
                    HasSubstr("is placed on rank 5, outside the mesh's 4 ranks"));
        placement->set_owner(lin->bias, 1);
        EXPECT_THAT(error_message([&] {
                      fully_shard(
                          lin, mesh,
                          FullyShardOptions().whole_tensor(placement).reshard_after_forward(2));
                    }),
                    HasSubstr("reshard_after_forward must be true or false, not the group size 2"));
      },
      test_options());
}

TEST(WholeTensorErrors, A2DMeshIsRefused) {
  run_ranks_in_threads(
      2,
      [](std::shared_ptr<ProcessGroup> group) {
        DeviceMesh mesh = DeviceMesh::hybrid(group, 2);
        auto lin = torch::nn::Linear(4, 3);
        EXPECT_THAT(error_message([&] { whole_tensor_shard(lin.ptr(), {}, mesh); }),
                    HasSubstr("the mesh is 2-D (2 x 1)"));
      },
      test_options());
}

}  // namespace
}  // namespace fsdp::test
