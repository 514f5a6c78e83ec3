// fsdp::tensor_parallel_parameter: a ReplicateParallel module's parameter, entering its forward
// through the gradient's all-reduce (see fsdp/tensor_parallel.h). The module is applied to this
// rank's slice of an activation (its heads), so the gradient each rank computes is the part of
// the sum over its slice; copy_to_tensor_parallel's backward adds the parts, on every rank, before
// the gradient reaches the parameter (and FSDP's reduction over dp after it).
#include <fsdp/tensor_parallel.h>

#include "tensor_parallel/tp_layer.h"

namespace fsdp {

at::Tensor tensor_parallel_parameter(const torch::nn::Module& module, const at::Tensor& param) {
  const detail::TpLayer* tp = detail::tp_layer_of(module);
  if (tp == nullptr || tp->style.kind() != ParallelStyle::Kind::kReplicate) return param;
  return detail::copy_to_tensor_parallel(param, tp->site);
}

}  // namespace fsdp
