// fsdp::linear and fsdp::tensor_parallel_linear: at::linear on a layer's (possibly FSDP-gathered)
// parameters, with the layer's tensor-parallel communication around it. See
// fsdp/tensor_parallel.h for the styles.
//
// The row-parallel all-reduce (or reduce-scatter) runs inside the layer's FSDP scope, before the
// bias is added: the bias is an FSDP parameter, readable only while the unit is gathered, and
// adding it after the sum adds it once rather than T times.
#include <fsdp/runtime/forward.h>
#include <fsdp/tensor_parallel.h>

#include "tensor_parallel/tp_layer.h"

#include <ATen/ATen.h>

namespace fsdp {
namespace {

// A column layer's input as its product needs it: gathered from sequence shards (the gather's
// backward reduce-scatters the partial gradient), through the gradient's all-reduce, or as it
// is when a sequence gather around the layer sums the gradient ([Note: one gradient sum for a
// gathered input]). Other layers' inputs pass as they are.
at::Tensor column_input(const detail::TpLayer* tp, const at::Tensor& x) {
  if (tp == nullptr || tp->style.kind() != ParallelStyle::Kind::kColwise) return x;
  if (tp->style.from() == Layout::kSequenceShard) {
    return detail::gather_sequence(x, tp->site, detail::GradientKind::kPartial);
  }
  return tp->input_gathered ? x : detail::copy_to_tensor_parallel(x, tp->site);
}

// The product, and a row layer's sum of the partial products over the group.
at::Tensor product(const detail::TpLayer* tp, const at::Tensor& input, const at::Tensor& weight,
                   const at::Tensor& bias) {
  if (tp == nullptr || tp->style.kind() != ParallelStyle::Kind::kRowwise) {
    return at::linear(input, weight, bias);
  }
  const at::Tensor partial = at::linear(input, weight);
  if (tp->style.to() == Layout::kReplicate) {
    const at::Tensor y = detail::reduce_from_tensor_parallel(partial, tp->site);
    return bias.defined() ? y + bias : y;
  }
  // Into sequence shards: the whole bias is added to this rank's positions only, so its gradient
  // is this shard's part of the sum, added up over the group.
  const at::Tensor y = detail::reduce_scatter_sequence(partial, tp->site);
  return bias.defined() ? y + detail::copy_to_tensor_parallel(bias, tp->site) : y;
}

}  // namespace

at::Tensor linear(torch::nn::Linear& layer, const at::Tensor& x) {
  const detail::TpLayer* tp = detail::tp_layer_of(*layer);
  return forward_with(
      layer,
      [&layer, tp](const at::Tensor& input) {
        return product(tp, input, layer->weight, layer->bias);
      },
      column_input(tp, x));
}

at::Tensor tensor_parallel_linear(const torch::nn::Module& layer, const at::Tensor& x,
                                  const at::Tensor& weight, const at::Tensor& bias) {
  const detail::TpLayer* tp = detail::tp_layer_of(layer);
  return product(tp, column_input(tp, x), weight, bias);
}

}  // namespace fsdp
