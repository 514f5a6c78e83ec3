// Activation checkpointing: run a piece of forward without keeping its intermediate tensors
// for backward, and recompute them when backward reaches it.
//
//   at::Tensor BlockImpl::forward(const at::Tensor& x) {
//     return fsdp::activation_checkpoint([this](const at::Tensor& in) { return body(in); }, x);
//   }
//
// Autograd then keeps only the inputs of the checkpointed function (here: the block's input);
// its backward re-runs the function with gradients enabled on those inputs and back-propagates
// through the recomputed graph. Gradients of the module's parameters accumulate into their
// .grad() as usual; gradients of the inputs flow on to the rest of the graph.
//
// With FSDP: checkpoint INSIDE a sharded unit (the body of the block's forward), and keep
// calling the unit through fsdp::forward(block, x). The order in backward is then
//   FSDP pre-backward hook on the unit's output (all-gathers the parameters)
//   -> the recompute, which reads the module's parameters at that moment (the full ones)
//   -> the unit's post-backward (reduce-scatters the gradients).
// The function must therefore read the parameters when it runs: through the module (capture
// `this`), or the parameter tensors themselves, whose data FSDP switches in place with
// set_data between the shard and the full value. A view, detach() or copy of a parameter made
// before the call still points at the data of that moment (after forward: the shard). Do not
// checkpoint a region that calls other sharded units: their forward would run again during
// backward.
//
// Randomness: the recompute must draw the same random numbers as forward (dropout). With
// preserve_rng_state (the default, as in torch.utils.checkpoint) the default generator of the
// inputs' device is saved before forward and restored around the recompute. Another thread
// drawing from the same generator between the two (ranks run as threads) changes what forward
// drew but not the replay, which sees the saved state.
//
// Limits: first-order gradients only (no create_graph through a checkpointed region); outputs
// must be new tensors, not views of the inputs; the function must give outputs of the same
// shapes when re-run.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <functional>
#include <vector>

namespace fsdp {

struct ActivationCheckpointOptions {
  // Save the default generator's state before forward and replay it for the recompute.
  // (optional) defaults to true.
  TORCH_ARG(bool, preserve_rng_state) = true;
};

using ActivationCheckpointFn =
    std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

// Runs fn(inputs) without saving activations for backward; see above. Blocks like fn itself.
// Undefined inputs are passed through as undefined. When grad mode is off (evaluation) this is
// a plain call of fn.
std::vector<at::Tensor> activation_checkpoint(const ActivationCheckpointFn& fn,
                                              const std::vector<at::Tensor>& inputs,
                                              const ActivationCheckpointOptions& options = {});

// One tensor in, one tensor out.
at::Tensor activation_checkpoint(const std::function<at::Tensor(const at::Tensor&)>& fn,
                                 const at::Tensor& input,
                                 const ActivationCheckpointOptions& options = {});

}  // namespace fsdp
