// parallelize_module: matches the plan's paths, slices each matched linear layer's parameters to
// this rank's part in place, and marks the layer with its style. See fsdp/tensor_parallel.h.
//
// Slicing happens once, before fully_shard: the full weight exists on every rank until then (as
// FSDP2's parallelize_module distributes a module built whole). The slice is copied into a
// tensor of its own, so the full weight's bytes are freed.
#include <fsdp/tensor_parallel.h>

#include "runtime/hooks.h"
#include "tensor_parallel/tp_layer.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>

#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

namespace fsdp {
namespace {

std::vector<std::string> components(const std::string& path) {
  std::vector<std::string> out;
  std::stringstream in(path);
  for (std::string part; std::getline(in, part, '.');) out.push_back(part);
  return out;
}

bool matches(const std::string& pattern, const std::string& path) {
  const auto want = components(pattern), have = components(path);
  if (want.size() != have.size()) return false;
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] != "*" && want[i] != have[i]) return false;
  }
  return true;
}

// Replaces param's data by its rank-th of size slices along dim, of each of packed equal blocks
// of dim (a copy, so the full tensor's bytes go), and records the placement.
void slice_in_place(at::Tensor& param, int64_t dim, int64_t packed, const detail::TpSite& site) {
  const std::vector<int64_t> global = param.sizes().vec();
  std::vector<int64_t> local = global;
  local[dim] =
      packed *
      tensor_parallel_range(global[dim] / packed, site.group->size(), site.group->rank()).length;
  TensorParallelPlacement placement{site.group, dim, packed, global};
  at::NoGradGuard no_grad;
  param.set_data(
      tensor_parallel_slice_view(param.detach().contiguous(), placement, site.group->rank())
          .reshape(local)
          .clone());
  detail::record_placement(param, std::move(placement));
}

void check_unstyled(const torch::nn::Module& module, const std::string& path) {
  TORCH_CHECK(detail::tp_layer_of(module) == nullptr, "parallelize_module: layer '", path,
              "' already has a tensor-parallel style");
  TORCH_CHECK(detail::param_group_of(module) == nullptr, "parallelize_module: layer '", path,
              "' is already sharded by fully_shard; apply tensor parallelism first");
}

// Marks module (called path) with style, which fsdp::linear and tensor_parallel_parameter find.
void attach_style(torch::nn::Module& module, const std::string& path, const ParallelStyle& style,
                  const detail::TpSite& site) {
  detail::TpSite named = site;
  named.layer = path;
  detail::attach_tp_layer(module, detail::TpLayer{style, std::move(named)});
}

// The split dimension of weight divides into the style's packed blocks and each block by the
// group's size, or, for a table's rows and a column split without packed blocks, leaves every
// rank at least one ([Note: an uneven vocabulary]).
void check_divides(const at::Tensor& weight, int64_t dim, const ParallelStyle& style,
                   const std::string& path, const detail::TpSite& site, bool table) {
  const int64_t split = weight.size(dim), packed = style.packed(), size = site.group->size();
  const bool colwise = style.kind() == ParallelStyle::Kind::kColwise;
  TORCH_CHECK(packed >= 1 && split % packed == 0, "parallelize_module: layer '", path, "' has ",
              split, " output features, not ", packed, " equal packed blocks");
  const bool may_be_uneven = packed == 1 && (table || colwise);
  if (may_be_uneven && tensor_parallel_range(split, size, size - 1).length >= 1) return;
  TORCH_CHECK(split / packed % size == 0, "parallelize_module: ", style.name(), " splits layer '",
              path, "' along its ",
              table     ? "vocabulary"
              : colwise ? "output features"
                        : "input features",
              ", ", split,
              packed > 1 ? " in " + std::to_string(packed) + " packed blocks" : std::string(),
              ", which do not divide by the tensor-parallel size ", size);
}

// A tied weight (an embedding table that is also the head's weight) meets a second split: it
// must be the one it has, which it keeps.
bool already_split(const at::Tensor& param, int64_t dim, int64_t packed, const std::string& path,
                   const detail::TpSite& site) {
  const TensorParallelPlacement* placement = tensor_parallel_placement(param);
  if (placement == nullptr) return false;
  TORCH_CHECK(
      placement->dim == dim && placement->packed == packed && placement->group == site.group,
      "parallelize_module: the weight of layer '", path,
      "' is shared with a layer split along dimension ", placement->dim,
      " and cannot also be split along dimension ", dim);
  return true;
}

// The column and row styles: a Linear's (or a tied head's) weight [out, in] and bias, or an
// Embedding's table [vocab, dim], cut as the top of fsdp/tensor_parallel.h says.
void parallelize_split(torch::nn::Module& module, const std::string& path,
                       const ParallelStyle& style, const detail::TpSite& site) {
  check_unstyled(module, path);
  auto params = module.named_parameters(/*recurse=*/false);
  at::Tensor* weight = params.find("weight");
  TORCH_CHECK(weight != nullptr && weight->dim() == 2, "parallelize_module: ", style.name(),
              " splits a 2-D parameter 'weight' (of a Linear, an Embedding or a tied head); "
              "layer '",
              path, "', a ", module.name(), ", has none");
  const bool table = dynamic_cast<const torch::nn::EmbeddingImpl*>(&module) != nullptr;
  const bool colwise = style.kind() == ParallelStyle::Kind::kColwise;
  TORCH_CHECK(!(table && colwise), "parallelize_module: layer '", path,
              "' is an Embedding: RowwiseParallel splits its vocabulary, ColwiseParallel does "
              "not apply");
  const int64_t dim = colwise || table ? 0 : 1;
  if (!already_split(*weight, dim, style.packed(), path, site)) {
    check_divides(*weight, dim, style, path, site, table);
    slice_in_place(*weight, dim, style.packed(), site);
  }
  at::Tensor* bias = params.find("bias");
  if (bias != nullptr && bias->defined() && colwise) slice_in_place(*bias, 0, style.packed(), site);
  attach_style(module, path, style, site);
  // Where this rank's rows (a table's) or output columns start: the vocabulary lookup and the
  // parallel loss need it when the split is uneven.
  detail::tp_layer_of(module)->first =
      tensor_parallel_range(tensor_parallel_placement(*weight)->global_shape[dim],
                            site.group->size(), site.group->rank())
          .begin;
}

void parallelize_whole(torch::nn::Module& module, const std::string& path,
                       const ParallelStyle& style, const detail::TpSite& site) {
  check_unstyled(module, path);
  TORCH_CHECK(style.kind() != ParallelStyle::Kind::kPrepareOutput ||
                  style.to() == Layout::kSequenceShard || style.from() == style.to(),
              "parallelize_module: PrepareModuleOutput on '", path,
              "' gathers its output from sequence shards; gather at the consumer's input with "
              "PrepareModuleInput instead, where the gradient's layout is known");
  attach_style(module, path, style, site);
}

// [Note: one gradient sum for a gathered input]
// Under sequence parallelism a module's input is gathered once (PrepareModuleInput) and read by
// several column layers (q, k and v); each layer's input gradient is a partial sum over the
// group. Autograd adds the layers' partial gradients on the rank first; the gather's backward
// then sums over the group and keeps this rank's sequence shard: one reduce-scatter for all of
// them, as DTensor's Partial placement gives FSDP2. So the column layers under such a gather skip
// their own all-reduce, and the gather reduce-scatters only when column layers are under it (a
// replicated module's input gradient is the same on every rank: the gather keeps its shard).
void link_sequence_gather(torch::nn::Module& module) {
  detail::TpLayer* gather = detail::tp_layer_of(module);
  if (gather == nullptr || gather->style.kind() != ParallelStyle::Kind::kPrepareInput ||
      gather->style.from() != Layout::kSequenceShard || gather->style.to() != Layout::kReplicate)
    return;
  bool partial = false;
  for (const auto& inner : module.modules(/*include_self=*/false)) {
    detail::TpLayer* layer = detail::tp_layer_of(*inner);
    if (layer == nullptr || layer->style.kind() != ParallelStyle::Kind::kColwise) continue;
    layer->input_gathered = true;
    partial = true;
  }
  gather->gather_gradient =
      partial ? detail::GradientKind::kPartial : detail::GradientKind::kReplicated;
}

}  // namespace

TensorParallelRange tensor_parallel_range(int64_t n, int size, int rank) {
  TORCH_CHECK(n >= 0 && size >= 1 && rank >= 0 && rank < size, "tensor_parallel_range: rank ", rank,
              " of ", size, " over ", n, " elements");
  const int64_t part = (n + size - 1) / size;
  const int64_t begin = std::min(n, rank * part);
  return {begin, std::min(part, n - begin)};
}

at::Tensor tensor_parallel_slice_view(const at::Tensor& full,
                                      const TensorParallelPlacement& placement, int rank) {
  const int64_t dim = placement.dim, packed = placement.packed;
  TORCH_CHECK(full.sizes() == c10::IntArrayRef(placement.global_shape),
              "tensor_parallel_slice_view: a tensor of shape ", full.sizes(),
              " is not the split tensor's full shape ", c10::IntArrayRef(placement.global_shape));
  std::vector<int64_t> blocks = placement.global_shape;  // [.., packed, dim / packed, ..]
  blocks[dim] /= packed;
  blocks.insert(blocks.begin() + dim, packed);
  const TensorParallelRange part =
      tensor_parallel_range(blocks[dim + 1], placement.group->size(), rank);
  return full.view(blocks).narrow(dim + 1, part.begin, part.length);
}

std::string ParallelStyle::name() const {
  switch (kind_) {
    case Kind::kColwise:
      return "ColwiseParallel";
    case Kind::kRowwise:
      return "RowwiseParallel";
    case Kind::kReplicate:
      return "ReplicateParallel";
    case Kind::kSequence:
      return "SequenceParallel";
    case Kind::kPrepareInput:
      return "PrepareModuleInput";
    case Kind::kPrepareOutput:
      return "PrepareModuleOutput";
  }
  return "?";
}

void parallelize_module(torch::nn::Module& module, const DeviceMesh& tp_mesh,
                        const TensorParallelPlan& plan) {
  TORCH_CHECK(tp_mesh.ndim() == 1, "parallelize_module: the tensor-parallel mesh must be 1-D, got ",
              tp_mesh.ndim(), " dimensions");
  const detail::TpSite site{tp_mesh.shard_group_ptr(), tp_mesh.name(), ""};
  const auto named = module.named_modules("", /*include_self=*/false);
  for (const auto& [pattern, style] : plan) {
    int matched = 0;
    for (const auto& item : named) {
      if (!matches(pattern, item.key())) continue;
      ++matched;
      if (style.kind() != ParallelStyle::Kind::kColwise &&
          style.kind() != ParallelStyle::Kind::kRowwise) {
        // Nothing is sliced: the module reads its parameters through tensor_parallel_parameter
        // and moves its input or output through tensor_parallel_input / _output.
        parallelize_whole(*item.value(), item.key(), style, site);
        continue;
      }
      parallelize_split(*item.value(), item.key(), style, site);
    }
    TORCH_CHECK(matched > 0, "parallelize_module: plan entry '", pattern, "' (", style.name(),
                ") matches no module under ", module.name());
  }
  link_sequence_gather(module);
  for (const auto& inner : module.modules(/*include_self=*/false)) link_sequence_gather(*inner);
}

}  // namespace fsdp
