// How the call site and autograd drive a unit: LibTorch modules have no forward hooks, so
// fully_shard attaches the unit to its module (found again by fsdp::forward, whose ForwardScope
// runs pre- and post-forward), and the backward hooks are autograd's own: a hook on each output's
// gradient (pre-backward), a node on the unit's inputs (post-backward) and an engine callback
// (end of backward).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <functional>
#include <memory>
#include <vector>

namespace fsdp::detail {

class ParamGroup;

// The unit attached to module by fully_shard, or nullptr.
ParamGroup* param_group_of(const torch::nn::Module& module);
// Attaches group to module (as a parameterless child module, so no global registry exists).
void attach_param_group(torch::nn::Module& module, std::shared_ptr<ParamGroup> group);

// Hooks group's pre_backward onto the gradient of every output that requires grad.
void register_pre_backward(ParamGroup& group, const std::vector<at::Tensor>& outputs);
// Routes the inputs that require grad through an autograd node whose backward runs group's
// post_backward once the gradients of all of them are computed; returns the routed inputs.
std::vector<at::Tensor> register_post_backward(ParamGroup& group, std::vector<at::Tensor> inputs);
// Runs fn when the backward pass now running finishes. Call only during backward.
void queue_backward_callback(std::function<void()> fn);

}  // namespace fsdp::detail
