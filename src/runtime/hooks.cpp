// Forward scope and hooks: the glue between a unit's state machine (ParamGroup) and the call
// site and autograd engine that drive it.
//
// Invariants:
// - A unit's state lives in a child module of the module it shards, so it lives and dies with
//   that module and fsdp::forward finds it from the module alone.
// - Every hook holds the unit weakly or keeps it alive itself: a graph dropped without a
//   backward leaks nothing, and a unit destroyed before its backward is simply skipped.
// - A ForwardScope that did not finish (forward threw) leaves its unit sharded and idle, so a
//   later call does not hang on a half-done step.
#include "runtime/hooks.h"

#include "runtime/param_group.h"

#include <fsdp/detail/forward_impl.h>

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/engine.h>

#include <utility>

namespace fsdp::detail {
namespace {

constexpr const char* kStateModuleName = "_fsdp_state";

// Parameterless child module that carries a unit's state.
class FSDPStateHolder : public torch::nn::Module {
 public:
  explicit FSDPStateHolder(std::shared_ptr<ParamGroup> group)
      : torch::nn::Module("FSDPState"), group(std::move(group)) {}
  std::shared_ptr<ParamGroup> group;
};

// Identity in forward (the inputs go in as a TensorList: autograd only tracks tensors passed as
// Tensor or TensorList, and a std::vector would bind to its catch-all overload); its backward runs
// once the gradients of all of a unit's inputs are computed, which is after every node of the
// unit's backward, so the unit's parameter gradients are complete (FSDP2's
// RegisterPostBackwardFunction). Carries a weak reference to the unit through
// AutogradContext::saved_data (an IValue capsule owns it, so nothing leaks when the graph is
// dropped without a backward).
struct GroupRef : torch::CustomClassHolder {
  explicit GroupRef(std::weak_ptr<ParamGroup> g) : group(std::move(g)) {}
  std::weak_ptr<ParamGroup> group;
};

struct PostBackwardFunction : public torch::autograd::Function<PostBackwardFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const std::shared_ptr<ParamGroup>& group,
                                                at::TensorList inputs) {
    ctx->saved_data["group"] = c10::IValue::make_capsule(c10::make_intrusive<GroupRef>(group));
    return torch::autograd::variable_list(inputs.begin(), inputs.end());
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto ref = c10::static_intrusive_pointer_cast<GroupRef>(ctx->saved_data["group"].toCapsule());
    if (std::shared_ptr<ParamGroup> group = ref->group.lock()) group->post_backward();
    // One gradient per forward argument: none for the group, then the inputs' own.
    grads.insert(grads.begin(), at::Tensor());
    return grads;
  }
};

}  // namespace

ParamGroup* param_group_of(const torch::nn::Module& module) {
  for (const auto& child : module.named_children()) {
    if (child.key() == kStateModuleName) {
      return static_cast<FSDPStateHolder&>(*child.value()).group.get();
    }
  }
  return nullptr;
}

void attach_param_group(torch::nn::Module& module, std::shared_ptr<ParamGroup> group) {
  module.register_module(kStateModuleName, std::make_shared<FSDPStateHolder>(std::move(group)));
}

void register_pre_backward(ParamGroup& group, const std::vector<at::Tensor>& outputs) {
  std::shared_ptr<ParamGroup> self = group.shared_from_this();
  for (const auto& out : outputs) {
    if (out.defined() && out.requires_grad()) {
      out.register_hook([self](const at::Tensor&) { self->pre_backward(); });
    }
  }
}

std::vector<at::Tensor> register_post_backward(ParamGroup& group, std::vector<at::Tensor> inputs) {
  torch::autograd::variable_list needing_grad;
  std::vector<size_t> positions;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].defined() && inputs[i].requires_grad()) {
      needing_grad.push_back(inputs[i]);
      positions.push_back(i);
    }
  }
  if (needing_grad.empty()) return inputs;
  const std::shared_ptr<ParamGroup> self = group.shared_from_this();
  torch::autograd::variable_list routed =
      PostBackwardFunction::apply(self, at::TensorList(needing_grad));
  for (size_t k = 0; k < positions.size(); ++k) inputs[positions[k]] = routed[k];
  return inputs;
}

void queue_backward_callback(std::function<void()> fn) {
  torch::autograd::Engine::get_default_engine().queue_callback(std::move(fn));
}

// ---- ForwardScope (include/fsdp/detail/forward_impl.h) ----

ForwardScope::ForwardScope(ParamGroup& group) : group_(group) {}

ForwardScope::~ForwardScope() {
  if (!finished_) group_.abort_forward();
}

std::vector<at::Tensor> ForwardScope::pre_forward(std::vector<at::Tensor> inputs) {
  group_.pre_forward();
  group_.cast_forward_inputs(inputs);
  if (!at::GradMode::is_enabled()) return inputs;
  return register_post_backward(group_, std::move(inputs));
}

void ForwardScope::finish(std::vector<at::Tensor>& outputs) {
  group_.post_forward(outputs);
  finished_ = true;
}

}  // namespace fsdp::detail
