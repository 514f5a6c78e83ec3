// The two autograd functions of Megatron-style tensor parallelism without sequence parallelism:
// each is the identity one way and an all-reduce over the tensor-parallel group the other way.
// Blocking: the all-reduce is waited for before the function returns (the next op needs it).
#pragma once

#include <fsdp/comm/process_group.h>

#include <ATen/core/Tensor.h>

#include <memory>
#include <string>

namespace fsdp::detail {

// Names a tensor-parallel layer's collectives in errors and the flight recorder.
struct TpSite {
  std::shared_ptr<ProcessGroup> group;
  std::string dim_name;  // the mesh dimension ("tp"), or "" when the mesh had none
  std::string layer;     // the layer's path as the plan named it
};

// Forward: x as it is. Backward: the gradient summed over the group. Where a replicated
// activation enters column-parallel layers, whose input gradients are partial sums.
at::Tensor copy_to_tensor_parallel(const at::Tensor& x, const TpSite& site);

// Forward: x summed over the group. Backward: the gradient as it is. Where row-parallel layers'
// partial products leave as one replicated activation.
at::Tensor reduce_from_tensor_parallel(const at::Tensor& x, const TpSite& site);

}  // namespace fsdp::detail
