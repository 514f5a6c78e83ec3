// The FSDP unit state machine; see param_group.h for the lifecycle.
//
// Gradient flow of one unit in backward: autograd accumulates full gradients into the
// (unsharded) parameters; post_backward copies them into one flat [W, S] buffer (S = the
// unit's padded shard numel over trainable parameters), reduce-scatters it, divides by W and
// hands each parameter a sharded gradient that is a view of the [S] output. A sharded gradient
// left from an earlier backward (accumulation without zero_grad) is stashed in pre_backward,
// because AccumulateGrad would otherwise try to add a full gradient to it, and added back in
// post_backward.
#include "runtime/param_group.h"

#include <fsdp/util/error.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/strides.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/engine.h>

#include <algorithm>

namespace fsdp::detail {
namespace {

constexpr const char* kStateModuleName = "_fsdp_state";

// Parameterless child module that carries a unit's state, so the state lives and dies with the
// module and fsdp::forward can find it from the module alone.
class FSDPStateHolder : public torch::nn::Module {
 public:
  explicit FSDPStateHolder(std::shared_ptr<ParamGroup> group)
      : torch::nn::Module("FSDPState"), group(std::move(group)) {}
  std::shared_ptr<ParamGroup> group;
};

// Identity in forward (the inputs go in as a TensorList: autograd only tracks tensors passed as
// Tensor or TensorList, and a std::vector would bind to its catch-all overload); its backward runs once the gradients of all of a unit's inputs are
// computed, which is after every node of the unit's backward, so the unit's parameter
// gradients are complete (FSDP2's RegisterPostBackwardFunction).
// Carries a weak reference to the unit through AutogradContext::saved_data (an IValue capsule
// owns it, so nothing leaks when the graph is dropped without a backward).
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

// A tensor over [offset, offset + numel(shape)) of flat's storage that is not an autograd
// view of flat: optimizers detach_() gradients in zero_grad, which views do not allow.
at::Tensor alias_of(const at::Tensor& flat, int64_t offset, c10::IntArrayRef shape) {
  at::NoGradGuard no_grad;
  at::Tensor alias = at::empty({0}, flat.options());
  alias.set_(flat.storage(), flat.storage_offset() + offset, shape, c10::contiguous_strides(shape));
  return alias;
}

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

ParamGroup::ParamGroup(torch::nn::Module* module, std::vector<FSDPParam> params, DeviceMesh mesh,
                       FullyShardOptions options)
    : module_(module),
      label_(module->name()),
      params_(std::move(params)),
      mesh_(std::move(mesh)),
      options_(options) {
  int64_t total = 0;
  for (const auto& p : params_) total += p.padded_numel();
  const auto dtype = params_.empty() ? at::kFloat : params_.front().param().scalar_type();
  flat_shards_ = at::empty({total}, at::TensorOptions().dtype(dtype).device(mesh_.device()));
  int64_t offset = 0;
  for (auto& p : params_) {
    p.init_sharded(flat_shards_.narrow(0, offset, p.padded_numel()));
    offset += p.padded_numel();
  }
}

void ParamGroup::set_path(std::string path, bool is_top) {
  path_ = std::move(path);
  label_ = is_top ? module_->name() + " (root)" : path_;
}

bool ParamGroup::reshard_after_forward() const {
  return options_.reshard_after_forward().value_or(!is_root());
}

void ParamGroup::rethrow_with_context(const char* what, const std::exception& e) const {
  TORCH_CHECK(false, "fsdp: ", what, " of unit '", label_, "' on rank ", mesh_.shard_rank(), " of ",
              mesh_.shard_size(), " failed: ", error_message(e));
}

void ParamGroup::lazy_init_as_root() {
  root_ = this;
  units_.clear();
  for (const auto& item : module_->named_modules()) {
    ParamGroup* group = param_group_of(*item.value());
    if (group == nullptr) continue;
    group->root_ = this;
    group->set_path(item.key(), group == this);
    units_.push_back(group);
  }
}

void ParamGroup::begin_step() {
  // A forward that was never followed by a backward (evaluation with grad enabled, or an
  // aborted step) leaves units unsharded: start the new step from a clean slate.
  for (ParamGroup* unit : units_) {
    if (unit->state_ != UnitState::kIdle) {
      unit->reshard();
      unit->state_ = UnitState::kIdle;
    }
  }
  forward_order_.clear();
  end_of_backward_queued_ = false;
}

void ParamGroup::pre_forward() {
  if (root_ == nullptr) lazy_init_as_root();
  if (is_root()) begin_step();
  TORCH_CHECK(state_ != UnitState::kForward, "fsdp: unit '", label_,
              "' was called again from inside its own forward");
  root_->forward_order_.push_back(this);
  unshard();
  state_ = UnitState::kForward;
}

void ParamGroup::post_forward(const std::vector<at::Tensor>& outputs) {
  const bool training = at::GradMode::is_enabled();
  if (training) {
    std::shared_ptr<ParamGroup> self = shared_from_this();
    for (const auto& out : outputs) {
      if (out.defined() && out.requires_grad()) {
        out.register_hook([self](const at::Tensor&) { self->pre_backward(); });
      }
    }
  }
  if (reshard_after_forward() || !training) reshard();
  state_ = training ? UnitState::kForwardDone : UnitState::kIdle;
}

void ParamGroup::abort_forward() {
  reshard();
  state_ = UnitState::kIdle;
}

void ParamGroup::queue_end_of_backward() {
  ParamGroup* root = root_ != nullptr ? root_ : this;
  if (root->end_of_backward_queued_) return;
  root->end_of_backward_queued_ = true;
  std::shared_ptr<ParamGroup> keep = root->shared_from_this();
  torch::autograd::Engine::get_default_engine().queue_callback(
      [keep] { keep->end_of_backward(); });
}

void ParamGroup::pre_backward() {
  if (state_ != UnitState::kForwardDone) return;  // a later output's hook, or no forward
  queue_end_of_backward();
  unshard();
  for (auto& p : params_) {
    if (!p.requires_grad()) continue;
    p.stashed_grad = p.param().grad();
    p.grad_stashed = true;
    p.param().mutable_grad() = at::Tensor();
  }
  state_ = UnitState::kBackward;
}

void ParamGroup::post_backward() {
  if (state_ != UnitState::kForwardDone && state_ != UnitState::kBackward) return;
  const bool in_backward = state_ == UnitState::kBackward;
  const int world = mesh_.shard_size();
  RankStats& stats = mesh_.stats();

  // Take each trainable parameter's full gradient of this backward (undefined if it got none)
  // and the sharded gradient it held before (undefined after zero_grad).
  std::vector<FSDPParam*> trainable;
  std::vector<at::Tensor> full_grads;
  std::vector<at::Tensor> previous;
  int64_t reduce_numel = 0;
  int64_t full_grad_bytes = 0;
  for (auto& p : params_) {
    if (!p.requires_grad()) continue;
    at::Tensor grad = p.param().grad();
    at::Tensor before = std::move(p.stashed_grad);
    if (!in_backward) {
      // Pre-backward never ran, so this unit got no gradient this backward: whatever
      // gradient the parameter holds is a sharded one from before.
      before = std::move(grad);
      grad = at::Tensor();
    }
    p.stashed_grad = at::Tensor();
    p.grad_stashed = false;
    p.param().mutable_grad() = at::Tensor();
    if (grad.defined()) full_grad_bytes += grad.nbytes();
    trainable.push_back(&p);
    full_grads.push_back(std::move(grad));
    previous.push_back(std::move(before));
    reduce_numel += p.padded_numel();
  }
  // The unit's full gradients are alive together with its full parameters at this point, the
  // unit's peak: record it, then release both.
  stats.add_unsharded_grads(full_grad_bytes);
  reshard();
  stats.add_unsharded_grads(-full_grad_bytes);
  state_ = UnitState::kIdle;
  if (trainable.empty()) return;

  if (world == 1) {
    // One rank: the full gradient is the sharded gradient; nothing to copy or reduce.
    for (size_t i = 0; i < trainable.size(); ++i) {
      FSDPParam& p = *trainable[i];
      const auto shape = p.layout().padded_shape(p.global_shape());
      at::Tensor grad = full_grads[i].defined()
                            ? alias_of(full_grads[i].contiguous(), 0, shape)
                            : at::zeros(shape, flat_shards_.options());
      if (previous[i].defined()) grad.add_(previous[i]);
      p.param().mutable_grad() = grad;
    }
    return;
  }

  at::Tensor reduce_input = at::empty({world * reduce_numel}, flat_shards_.options());
  const at::Tensor input_2d = reduce_input.view({world, reduce_numel});
  int64_t column = 0;
  for (size_t i = 0; i < trainable.size(); ++i) {
    const at::Tensor slot = input_2d.narrow(1, column, trainable[i]->padded_numel());
    if (full_grads[i].defined()) {
      trainable[i]->copy_grad_into(full_grads[i], slot);
    } else {
      slot.zero_();  // an unused parameter contributes a zero gradient
    }
    full_grads[i] = at::Tensor();
    column += trainable[i]->padded_numel();
  }

  at::Tensor reduced = at::empty({reduce_numel}, flat_shards_.options());
  const int64_t input_bytes = reduce_input.nbytes();
  stats.add_comm_buffers(input_bytes);
  try {
    mesh_.shard_group().reduce_scatter_tensor(reduced, reduce_input, ReduceOp::kSum)->wait();
  } catch (const std::exception& e) {
    stats.add_comm_buffers(-input_bytes);
    rethrow_with_context("reduce-scatter of gradients", e);
  }
  stats.add_comm_buffers(-input_bytes);
  reduce_input = at::Tensor();
  reduced.div_(world);

  int64_t offset = 0;
  for (size_t i = 0; i < trainable.size(); ++i) {
    FSDPParam& p = *trainable[i];
    at::Tensor grad = alias_of(reduced, offset, p.layout().padded_shape(p.global_shape()));
    if (previous[i].defined()) grad.add_(previous[i]);
    p.param().mutable_grad() = grad;
    offset += p.padded_numel();
  }
}

void ParamGroup::end_of_backward() {
  end_of_backward_queued_ = false;
  for (auto it = forward_order_.rbegin(); it != forward_order_.rend(); ++it) {
    (*it)->post_backward();
  }
  for (ParamGroup* unit : units_) {
    unit->reshard();
    unit->state_ = UnitState::kIdle;
  }
}

void ParamGroup::unshard() {
  if (unsharded_) return;
  if (params_.empty()) {
    unsharded_ = true;
    return;
  }
  const int world = mesh_.shard_size();
  if (world == 1) {
    // Nothing to gather: the shard is the parameter. No bytes are added, and none are counted.
    for (auto& p : params_) p.unshard_single_rank();
    unsharded_ = true;
    return;
  }
  const int64_t shard_numel = flat_shards_.numel();
  RankStats& stats = mesh_.stats();
  at::Tensor gathered = at::empty({world * shard_numel}, flat_shards_.options());
  stats.add_comm_buffers(gathered.nbytes());
  try {
    mesh_.shard_group().all_gather_into_tensor(gathered, flat_shards_)->wait();
  } catch (const std::exception& e) {
    stats.add_comm_buffers(-gathered.nbytes());
    rethrow_with_context("all-gather of parameters", e);
  }
  const at::Tensor gathered_2d = gathered.view({world, shard_numel});
  int64_t column = 0;
  for (auto& p : params_) {
    p.unshard_from(gathered_2d, column);
    stats.add_unsharded_params(p.unsharded_bytes());
    column += p.padded_numel();
  }
  stats.add_comm_buffers(-gathered.nbytes());
  unsharded_ = true;
}

void ParamGroup::reshard() {
  if (!unsharded_) return;
  const bool counted = mesh_.shard_size() > 1;
  for (auto& p : params_) {
    if (p.is_unsharded() && counted) mesh_.stats().add_unsharded_params(-p.unsharded_bytes());
    p.reshard();
  }
  unsharded_ = false;
}

// ---- ForwardScope (include/fsdp/detail/forward_impl.h) ----

ForwardScope::ForwardScope(ParamGroup& group) : group_(group) {}

ForwardScope::~ForwardScope() {
  if (!finished_) group_.abort_forward();
}

std::vector<at::Tensor> ForwardScope::pre_forward(std::vector<at::Tensor> inputs) {
  group_.pre_forward();
  if (!at::GradMode::is_enabled()) return inputs;
  torch::autograd::variable_list needing_grad;
  std::vector<size_t> positions;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].defined() && inputs[i].requires_grad()) {
      needing_grad.push_back(inputs[i]);
      positions.push_back(i);
    }
  }
  if (needing_grad.empty()) return inputs;
  std::shared_ptr<ParamGroup> group = group_.shared_from_this();
  torch::autograd::variable_list routed = PostBackwardFunction::apply(group, at::TensorList(needing_grad));
  for (size_t k = 0; k < positions.size(); ++k) inputs[positions[k]] = routed[k];
  return inputs;
}

void ForwardScope::finish(std::vector<at::Tensor>& outputs) {
  group_.post_forward(outputs);
  finished_ = true;
}

}  // namespace fsdp::detail
