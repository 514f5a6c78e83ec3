// The autograd functions of Megatron-style tensor parallelism: each moves an activation one way
// and its gradient the other, over the tensor-parallel group. Without sequence parallelism they
// are the identity one way and an all-reduce the other; with it, an all-gather, a reduce-scatter
// or a slice of the sequence (dimension 1 of [batch, seq, ...]). Blocking: each collective is
// waited for before the function returns (the next op needs its result).
#pragma once

#include <fsdp/comm/process_group.h>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/custom_function.h>

#include <functional>

#include <memory>
#include <string>

namespace fsdp::detail {

// Names a tensor-parallel layer's collectives in errors and the flight recorder.
struct TpSite {
  std::shared_ptr<ProcessGroup> group;
  std::string dim_name;  // the mesh dimension ("tp"), or "" when the mesh had none
  std::string layer;     // the layer's path as the plan named it
};

// Runs the collective start() begins on site's group and waits for it; a failure or a timeout
// becomes an error naming op, what it moved, the layer, the mesh dimension and the rank.
void run_checked(const TpSite& site, const char* op, const char* what,
                 const std::function<WorkHandle()>& start);

// site in an IValue for AutogradContext::saved_data["site"], and back (freed with the graph).
c10::IValue site_capsule(const TpSite& site);
const TpSite& site_of(torch::autograd::AutogradContext* ctx);

// Forward: x as it is. Backward: the gradient summed over the group. Where a replicated
// activation enters column-parallel layers, whose input gradients are partial sums.
at::Tensor copy_to_tensor_parallel(const at::Tensor& x, const TpSite& site);

// Forward: x summed over the group. Backward: the gradient as it is. Where row-parallel layers'
// partial products leave as one replicated activation.
at::Tensor reduce_from_tensor_parallel(const at::Tensor& x, const TpSite& site);

// Where a sequence gather's gradient comes from: column layers, whose input gradients are
// partial sums over the group, or replicated computation, whose gradient is the same everywhere.
enum class GradientKind { kPartial, kReplicated };

// Forward: the sequence shards gathered (all-gather). Backward: the gradient's sequence shards
// summed over the group (reduce-scatter) for kPartial; this rank's shard of it for kReplicated.
at::Tensor gather_sequence(const at::Tensor& x, const TpSite& site, GradientKind gradient);

// Forward: this rank's sequence shard of a replicated x. Backward: the shards gathered.
at::Tensor scatter_sequence(const at::Tensor& x, const TpSite& site);

// Forward: x's partial sums summed over the group, this rank keeping its sequence shard
// (reduce-scatter). Backward: the gradient's shards gathered (all-gather).
at::Tensor reduce_scatter_sequence(const at::Tensor& x, const TpSite& site);

}  // namespace fsdp::detail
