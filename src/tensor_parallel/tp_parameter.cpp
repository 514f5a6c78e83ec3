// fsdp::tensor_parallel_parameter, fsdp::tensor_parallel_input and fsdp::tensor_parallel_output:
// the call sites through which a model applies the styles of modules that slice no weight (see
// fsdp/tensor_parallel.h).
//
// A ReplicateParallel or SequenceParallel module is applied to this rank's slice of an
// activation (its heads, or its sequence shard), so the gradient each rank computes for its
// whole parameters is the part of the sum over its slice; copy_to_tensor_parallel's backward
// adds the parts, on every rank, before the gradient reaches the parameter (and FSDP's
// reduction over dp after it).
#include <fsdp/tensor_parallel.h>

#include "tensor_parallel/tp_layer.h"

namespace fsdp {
namespace {

// x moved from style.from() to style.to() on layer's group.
at::Tensor moved(const detail::TpLayer& layer, const at::Tensor& x) {
  const ParallelStyle& style = layer.style;
  if (style.from() == style.to()) return x;
  if (style.to() == Layout::kSequenceShard) return detail::scatter_sequence(x, layer.site);
  return detail::gather_sequence(x, layer.site, layer.gather_gradient);
}

}  // namespace

at::Tensor tensor_parallel_parameter(const torch::nn::Module& module, const at::Tensor& param) {
  const detail::TpLayer* tp = detail::tp_layer_of(module);
  if (tp == nullptr) return param;
  const ParallelStyle::Kind kind = tp->style.kind();
  if (kind != ParallelStyle::Kind::kReplicate && kind != ParallelStyle::Kind::kSequence)
    return param;
  return detail::copy_to_tensor_parallel(param, tp->site);
}

at::Tensor tensor_parallel_input(const torch::nn::Module& module, const at::Tensor& x) {
  const detail::TpLayer* tp = detail::tp_layer_of(module);
  if (tp == nullptr || tp->style.kind() != ParallelStyle::Kind::kPrepareInput) return x;
  return moved(*tp, x);
}

at::Tensor tensor_parallel_output(const torch::nn::Module& module, const at::Tensor& y) {
  const detail::TpLayer* tp = detail::tp_layer_of(module);
  if (tp == nullptr || tp->style.kind() != ParallelStyle::Kind::kPrepareOutput) return y;
  return moved(*tp, y);
}

}  // namespace fsdp
