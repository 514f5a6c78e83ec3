// How a parallelized linear layer carries its style: a parameterless child module, as a unit's
// FSDP state does (runtime/hooks.h), so it lives and dies with the layer and fsdp::linear finds
// it from the layer alone.
#pragma once

#include "tensor_parallel/tp_collectives.h"

#include <fsdp/tensor_parallel.h>

#include <torch/nn/module.h>

#include <memory>

namespace fsdp::detail {

struct TpLayer {
  ParallelStyle style;
  TpSite site;
  // ColwiseParallel: an enclosing module's PrepareModuleInput gathers this layer's input from
  // sequence shards, and that gather's backward sums its gradient, so the layer does not.
  bool input_gathered = false;
  // PrepareModuleInput from sequence shards: what its gather's backward receives (kPartial when
  // the module holds column layers).
  GradientKind gather_gradient = GradientKind::kReplicated;
  // The column and row styles: the first index of this rank's slice of the split dimension of the
  // full weight (a table's first row, a column layer's first output): tensor_parallel_range's.
  int64_t first = 0;
};

// The style parallelize_module gave module, or nullptr.
const TpLayer* tp_layer_of(const torch::nn::Module& module);
TpLayer* tp_layer_of(torch::nn::Module& module);
void attach_tp_layer(torch::nn::Module& module, TpLayer layer);

// Records that param (by identity: FSDP's set_data keeps it) is split as placement says.
void record_placement(const at::Tensor& param, TensorParallelPlacement placement);

}  // namespace fsdp::detail
