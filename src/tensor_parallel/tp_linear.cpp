// fsdp::linear: at::linear on a layer's (possibly FSDP-gathered) parameters, with the layer's
// tensor-parallel communication around it. See fsdp/tensor_parallel.h for the styles.
//
// The row-parallel all-reduce (or reduce-scatter) runs inside the layer's FSDP scope, before the bias is added: the
// bias is an FSDP parameter, readable only while the unit is gathered, and adding it after the
// sum adds it once rather than T times.
#include <fsdp/runtime/forward.h>
#include <fsdp/tensor_parallel.h>

#include "tensor_parallel/tp_layer.h"

#include <ATen/ATen.h>

namespace fsdp {

at::Tensor linear(torch::nn::Linear& layer, const at::Tensor& x) {
  const detail::TpLayer* tp = detail::tp_layer_of(*layer);
  if (tp != nullptr && tp->style.kind() == ParallelStyle::Kind::kRowwise) {
    return forward_with(
        layer,
        [&layer, tp](const at::Tensor& input) {
          const at::Tensor partial = at::linear(input, layer->weight);
          if (tp->style.to() == Layout::kReplicate) {
            const at::Tensor y = detail::reduce_from_tensor_parallel(partial, tp->site);
            return layer->bias.defined() ? y + layer->bias : y;
          }
          // Into sequence shards: the whole bias is added to this rank's positions only, so its
          // gradient is this shard's part of the sum, added up over the group.
          const at::Tensor y = detail::reduce_scatter_sequence(partial, tp->site);
          return layer->bias.defined()
                     ? y + detail::copy_to_tensor_parallel(layer->bias, tp->site)
                     : y;
        },
        x);
  }
  // A column layer's input enters through the gradient's all-reduce, unless a sequence gather
  // around it sums the gradient ([Note: one gradient sum for a gathered input]).
  const bool sums_input_gradient = tp != nullptr &&
                                   tp->style.kind() == ParallelStyle::Kind::kColwise &&
                                   !tp->input_gathered;
  const at::Tensor in = sums_input_gradient ? detail::copy_to_tensor_parallel(x, tp->site) : x;
  return forward_with(
      layer,
      [&layer](const at::Tensor& input) { return at::linear(input, layer->weight, layer->bias); },
      in);
}

}  // namespace fsdp
