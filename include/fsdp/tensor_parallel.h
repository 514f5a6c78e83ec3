// Tensor parallelism (Megatron-LM's column and row splits of linear layers) over one mesh
// dimension, composable with fully_shard over another, as FSDP2's parallelize_module with
// ColwiseParallel / RowwiseParallel and fully_shard on the dp sub-mesh.
//
// parallelize_module(module, tp_mesh, plan) replaces the weights of the plan's linear layers by
// this rank's slice, in place (the parameters keep their identity, so optimizers and fully_shard
// see the local slices), and marks each layer with its style. Call it before fully_shard: FSDP
// then shards the local slices over its own mesh (dim 0 of the local tensor, FSDP2's
// composition). The layers must be called through fsdp::linear, which adds each style's
// communication around at::linear:
//
//   ColwiseParallel: weight [out / T, in] (rows r*out/T.. of the full weight; of each block, for
//     a packed projection), bias [out / T].
//     Input replicated; output this rank's slice of the last dimension. Forward: nothing;
//     backward: the input's gradient is summed over the group (all-reduce).
//   RowwiseParallel: weight [out, in / T] (columns), bias [out] replicated. Input this rank's
//     slice of the last dimension (a colwise layer's output); output replicated. Forward: the
//     partial products are summed over the group (all-reduce), then the bias is added;
//     backward: nothing.
//
//   ReplicateParallel: any module whose parameters stay whole on every rank but which is applied
//     to this rank's slice of an activation (Qwen3's per-head q/k norms, over this rank's heads),
//     so each rank's parameter gradients are partial sums. Forward: nothing; backward: those
//     gradients are summed over the group. The module reads its parameters through
//     fsdp::tensor_parallel_parameter.
//
// A column layer followed by a row layer (attention's q/k/v then o, the MLP's gate/up then down)
// communicates once each way. Every collective is checked as FSDP's are: one that fails or times
// out throws naming the layer, the mesh dimension, the rank and the operation.
#pragma once

#include <fsdp/device_mesh.h>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace fsdp {

class ParallelStyle {
 public:
  enum class Kind { kColwise, kRowwise, kReplicate };
  Kind kind() const { return kind_; }
  // Column styles: the output features are this many equal blocks, each split on its own (a
  // fused projection: GPT-2's c_attn is q, k and v, packed 3), so every rank gets its part of
  // each block, in block order. 1 otherwise.
  int64_t packed() const { return packed_; }
  std::string name() const;  // "ColwiseParallel", "RowwiseParallel" or "ReplicateParallel"

 protected:
  ParallelStyle(Kind kind, int64_t packed) : kind_(kind), packed_(packed) {}

 private:
  Kind kind_;
  int64_t packed_;
};

struct ColwiseParallel : ParallelStyle {
  // packed: see ParallelStyle::packed. (optional) defaults to 1.
  explicit ColwiseParallel(int64_t packed = 1) : ParallelStyle(Kind::kColwise, packed) {}
};

struct RowwiseParallel : ParallelStyle {
  RowwiseParallel() : ParallelStyle(Kind::kRowwise, 1) {}
};

struct ReplicateParallel : ParallelStyle {
  ReplicateParallel() : ParallelStyle(Kind::kReplicate, 1) {}
};

// Module paths relative to the module given to parallelize_module ("self_attn.q_proj"), each
// with its style. A "*" component matches any one component ("layers.*.mlp.up_proj").
using TensorParallelPlan = std::vector<std::pair<std::string, ParallelStyle>>;

// Applies plan to the modules under module (see the top of this file). Every entry must match at
// least one module, each match must be not yet parallelized or sharded by fully_shard and, for
// the column and row styles, a torch::nn::Linear whose split dimension (out for colwise, in for
// rowwise) divides by the mesh's size; otherwise throws naming the entry, the layer and the
// sizes. Not collective: every
// rank of tp_mesh slices its own part. tp_mesh must be 1-D.
void parallelize_module(torch::nn::Module& module, const DeviceMesh& tp_mesh,
                        const TensorParallelPlan& plan);

// y = x W^T + b for a linear layer: at::linear, inside fsdp::forward_with (so the layer may be an
// FSDP unit), with the layer's tensor-parallel communication around it when it has a style.
at::Tensor linear(torch::nn::Linear& layer, const at::Tensor& x);

// param (a parameter of module) as module's forward should use it: under ReplicateParallel
// through the gradient's all-reduce over the group, otherwise param itself.
at::Tensor tensor_parallel_parameter(const torch::nn::Module& module, const at::Tensor& param);

// Where a parameter is split by tensor parallelism: the group it is split over and the
// dimension of the full tensor that is split (0: colwise weight and bias; 1: rowwise weight).
struct TensorParallelPlacement {
  std::shared_ptr<ProcessGroup> group;
  int64_t dim = 0;
  int64_t packed = 1;                 // the split dimension's equal blocks, each split on its own
  std::vector<int64_t> global_shape;  // the full tensor's shape
};

// The placement of param (a parameter of a parallelized layer, possibly sharded by FSDP since),
// or nullptr if tensor parallelism does not split it (replicated on the group, or no TP at all).
const TensorParallelPlacement* tensor_parallel_placement(const at::Tensor& param);

// The part of `full` (a tensor of placement.global_shape) that rank `rank` of the placement's
// group holds, as a view of full whose split dimension is two: [packed blocks, this rank's part
// of each]. reshape() to the slice's shape gives the rank's tensor; copy_() into it places one.
at::Tensor tensor_parallel_slice_view(const at::Tensor& full,
                                      const TensorParallelPlacement& placement, int rank);

}  // namespace fsdp
