// Gradient-norm clipping across shards.
#pragma once

#include <fsdp/device_mesh.h>

#include <ATen/core/Tensor.h>

#include <vector>

namespace fsdp {

// Clips the gradients of parameters (this rank's shards, e.g. unique_parameters(*model)) so
// that the 2-norm of the full, unsharded gradient is at most max_norm, and returns that norm
// before clipping. Collective: every rank of mesh must call it. The norm equals what
// torch::nn::utils::clip_grad_norm_ returns for the same gradients in one process (padding
// rows are zero and add nothing); with one rank the arithmetic is the same, bit for bit.
double clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm,
                       const DeviceMesh& mesh);

// The global 2-norm of the gradients without clipping. Collective.
double grad_norm(const std::vector<at::Tensor>& parameters, const DeviceMesh& mesh);

}  // namespace fsdp
