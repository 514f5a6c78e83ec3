// The FSDP unit state machine; see param_group.h for the lifecycle and the overlap scheme.
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
  compute_dtype_ = options_.mp_policy().param_dtype().value_or(dtype);
  reduce_dtype_ = options_.mp_policy().reduce_dtype().value_or(compute_dtype_);
  flat_shards_ = at::empty({total}, at::TensorOptions().dtype(dtype).device(mesh_.device()));
  int64_t offset = 0;
  for (auto& p : params_) {
    p.init_sharded(flat_shards_.narrow(0, offset, p.padded_numel()));
    offset += p.padded_numel();
  }
  if (options_.reshard_after_forward().has_value()) {
    // fully_shard checked that the size divides the shard group.
    const int size = options_.reshard_after_forward()->group_size(mesh_.shard_size());
    if (size > 1 && size < mesh_.shard_size() && !params_.empty()) {
      post_forward_group_ = mesh_.post_forward_group(size);
    }
  }
}

void ParamGroup::set_path(std::string path, bool is_top) {
  path_ = std::move(path);
  label_ = is_top ? module_->name() + " (root)" : path_;
}

bool ParamGroup::reshard_after_forward() const {
  const auto& option = options_.reshard_after_forward();
  return option.has_value() ? option->frees_after_forward() : !is_root();
}

void ParamGroup::set_implicit_prefetch(int count) {
  TORCH_CHECK(count >= 0, "fsdp: the implicit prefetch count must be >= 0, got ", count);
  implicit_prefetch_ = count;
}

std::vector<ParamGroup*> ParamGroup::units_under() const {
  std::vector<ParamGroup*> units;
  for (const auto& m : module_->modules()) {
    if (ParamGroup* unit = param_group_of(*m)) units.push_back(unit);
  }
  return units;
}

void ParamGroup::check_not_in_backward(const char* setting) const {
  // From the root's training forward to the end of its backward, units act on these settings
  // at different times; a change in between would leave ranks or units disagreeing.
  const ParamGroup* root = root_ != nullptr ? root_ : this;
  TORCH_CHECK(root->state_ == UnitState::kIdle && !root->end_of_backward_queued_, "fsdp: ", setting,
              " called on unit '", label_,
              "' while a backward pass is running (or pending after forward); change it before "
              "the forward of the micro-batch it applies to");
}

void ParamGroup::set_requires_gradient_sync(bool sync) {
  check_not_in_backward(sync ? "set_requires_gradient_sync(true)"
                             : "set_requires_gradient_sync(false)");
  requires_gradient_sync_ = sync;
}

void ParamGroup::set_reshard_after_backward(bool reshard) {
  check_not_in_backward(reshard ? "set_reshard_after_backward(true)"
                                : "set_reshard_after_backward(false)");
  reshard_after_backward_ = reshard;
}

void ParamGroup::set_reshard_after_forward(bool reshard) {
  check_not_in_backward(reshard ? "set_reshard_after_forward(true)"
                                : "set_reshard_after_forward(false)");
  options_.reshard_after_forward(reshard);
  post_forward_group_ = nullptr;  // a bool replaces an int given to fully_shard
}

void ParamGroup::set_is_last_backward(bool last) {
  check_not_in_backward(last ? "set_is_last_backward(true)" : "set_is_last_backward(false)");
  is_last_backward_ = last;
}

int ParamGroup::implicit_prefetch() const {
  return root_ != nullptr ? root_->implicit_prefetch_ : implicit_prefetch_;
}

void ParamGroup::rethrow_with_context(const char* what, const std::exception& e) const {
  TORCH_CHECK(false, "fsdp: ", what, " of unit '", label_, "' on rank ", mesh_.shard_rank(), " of ",
              mesh_.shard_size(), " failed: ", error_message(e));
}

void ParamGroup::wait_for(const WorkHandle& work, const char* what) {
  const auto start = Tracer::Clock::now();
  try {
    work->wait();
  } catch (const std::exception& e) {
    rethrow_with_context(what, e);
  }
  mesh_.stats().add_exposed_comm(
      std::chrono::duration<double>(Tracer::Clock::now() - start).count());
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
    unit->last_forward_index_ = -1;
    unit->forward_index_ = -1;
  }
  if (!forward_order_.empty()) last_forward_order_ = std::move(forward_order_);
  for (size_t i = 0; i < last_forward_order_.size(); ++i) {
    if (last_forward_order_[i]->last_forward_index_ < 0) {
      last_forward_order_[i]->last_forward_index_ = static_cast<int>(i);
    }
  }
  forward_order_.clear();
  end_of_backward_queued_ = false;
}

void ParamGroup::prefetch_forward() {
  if (!forward_prefetch_.empty()) {
    for (ParamGroup* unit : forward_prefetch_) unit->issue_unshard();
    return;
  }
  const int count = implicit_prefetch();
  if (count == 0 || last_forward_index_ < 0) return;
  const auto& order = root_->last_forward_order_;
  for (int k = 1; k <= count && last_forward_index_ + k < static_cast<int>(order.size()); ++k) {
    order[last_forward_index_ + k]->issue_unshard();
  }
}

void ParamGroup::prefetch_backward() {
  if (!backward_prefetch_.empty()) {
    for (ParamGroup* unit : backward_prefetch_) unit->issue_unshard();
    return;
  }
  const int count = implicit_prefetch();
  if (count == 0 || forward_index_ < 0) return;
  const auto& order = root_->forward_order_;
  for (int k = 1; k <= count && forward_index_ - k >= 0; ++k) {
    ParamGroup* unit = order[forward_index_ - k];
    // Only units whose backward is still to come; the root gathers once, in forward.
    if (unit->state_ == UnitState::kForwardDone) unit->issue_unshard();
  }
}

void ParamGroup::pre_forward() {
  if (root_ == nullptr) lazy_init_as_root();
  if (is_root()) begin_step();
  TORCH_CHECK(state_ != UnitState::kForward, "fsdp: unit '", label_,
              "' was called again from inside its own forward");
  if (forward_index_ < 0) forward_index_ = static_cast<int>(root_->forward_order_.size());
  root_->forward_order_.push_back(this);
  issue_unshard();
  prefetch_forward();
  wait_unshard();
  state_ = UnitState::kForward;
  compute_begin_ = Tracer::Clock::now();
}

void ParamGroup::post_forward(std::vector<at::Tensor>& outputs) {
  mesh_.tracer().complete("compute", "forward", compute_begin_, Tracer::Clock::now(), label_);
  if (const auto dtype = options_.mp_policy().output_dtype()) {
    for (auto& out : outputs) {
      if (out.defined() && out.is_floating_point()) out = out.to(*dtype);
    }
  }
  const bool training = at::GradMode::is_enabled();
  if (training) {
    std::shared_ptr<ParamGroup> self = shared_from_this();
    for (const auto& out : outputs) {
      if (out.defined() && out.requires_grad()) {
        out.register_hook([self](const at::Tensor&) { self->pre_backward(); });
      }
    }
  }
  if (!training) {
    reshard();
  } else if (reshard_after_forward()) {
    if (post_forward_group_) {
      reshard_to_post_forward_group();
    } else {
      reshard();
    }
  }
  state_ = training ? UnitState::kForwardDone : UnitState::kIdle;
}

void ParamGroup::reshard_to_post_forward_group() {
  const int64_t shards = mesh_.shard_size() / post_forward_group_->size();
  const int64_t first = post_forward_group_->rank() * shards;
  const int64_t numel = flat_shards_.numel();
  at::Tensor piece = at::empty({shards * numel}, flat_shards_.options().dtype(compute_dtype_));
  {
    TraceScope trace(mesh_.tracer(), "copy", "copy-in", label_);
    at::NoGradGuard no_grad;
    const at::Tensor piece_2d = piece.view({shards, numel});
    int64_t column = 0;
    for (auto& p : params_) {
      p.copy_chunks_into(p.param(), piece_2d.narrow(1, column, p.padded_numel()), first);
      column += p.padded_numel();
    }
  }
  reshard();
  post_forward_piece_ = std::move(piece);
  mesh_.stats().add_unsharded_params(post_forward_piece_.nbytes());
}

void ParamGroup::drop_post_forward_piece() {
  if (!post_forward_piece_.defined()) return;
  mesh_.stats().add_unsharded_params(-post_forward_piece_.nbytes());
  post_forward_piece_ = at::Tensor();
}

void ParamGroup::cast_forward_inputs(std::vector<at::Tensor>& inputs) const {
  const MixedPrecisionPolicy& mp = options_.mp_policy();
  if (!mp.cast_forward_inputs() || !mp.param_dtype().has_value()) return;
  for (auto& input : inputs) {
    if (input.defined() && input.is_floating_point()) input = input.to(*mp.param_dtype());
  }
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
  torch::autograd::Engine::get_default_engine().queue_callback([keep] { keep->end_of_backward(); });
}

void ParamGroup::pre_backward() {
  if (state_ != UnitState::kForwardDone) return;  // a later output's hook, or no forward
  queue_end_of_backward();
  issue_unshard();
  prefetch_backward();
  wait_unshard();
  for (auto& p : params_) {
    if (!p.requires_grad()) continue;
    p.stashed_grad = p.param().grad();
    p.param().mutable_grad() = at::Tensor();
  }
  state_ = UnitState::kBackward;
  compute_begin_ = Tracer::Clock::now();
}

void ParamGroup::post_backward() {
  if (state_ != UnitState::kForwardDone && state_ != UnitState::kBackward) return;
  const bool in_backward = state_ == UnitState::kBackward;
  if (in_backward) {
    mesh_.tracer().complete("compute", "backward", compute_begin_, Tracer::Clock::now(), label_);
  }
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
  if (reshard_after_backward_) reshard();
  stats.add_unsharded_grads(-full_grad_bytes);
  state_ = UnitState::kIdle;
  if (trainable.empty()) return;

  // Gradients of earlier backward passes that did not sync are added first, so the sum is
  // formed in the same order as autograd's accumulation in a single process.
  for (size_t i = 0; i < trainable.size(); ++i) {
    FSDPParam& p = *trainable[i];
    if (!p.unsynced_grad.defined()) continue;
    stats.add_unsharded_grads(-p.unsynced_grad.nbytes());
    if (full_grads[i].defined()) p.unsynced_grad.add_(full_grads[i]);
    full_grads[i] = std::move(p.unsynced_grad);
    p.unsynced_grad = at::Tensor();
  }
  if (!requires_gradient_sync_) {
    // No reduction this time: keep the full gradients (in the reduce dtype) for the backward
    // that syncs, and give the parameters back the sharded gradients they had.
    for (size_t i = 0; i < trainable.size(); ++i) {
      FSDPParam& p = *trainable[i];
      if (full_grads[i].defined()) {
        p.unsynced_grad = full_grads[i].to(reduce_dtype_).contiguous();
        stats.add_unsharded_grads(p.unsynced_grad.nbytes());
      }
      p.param().mutable_grad() = previous[i];
    }
    return;
  }

  ProcessGroup* replicas = mesh_.replicate_group();
  if (world == 1 && replicas == nullptr) {
    // One rank: the full gradient is the sharded gradient; nothing to copy or reduce. (Rounding
    // through the reduce dtype is kept, as a one-rank reduction in it would do.)
    const at::ScalarType master_dtype = flat_shards_.scalar_type();
    for (size_t i = 0; i < trainable.size(); ++i) {
      FSDPParam& p = *trainable[i];
      const auto shape = p.layout().padded_shape(p.global_shape());
      at::Tensor grad =
          full_grads[i].defined()
              ? alias_of(full_grads[i].to(reduce_dtype_).to(master_dtype).contiguous(), 0, shape)
              : at::zeros(shape, flat_shards_.options());
      if (previous[i].defined()) grad.add_(previous[i]);
      p.param().mutable_grad() = grad;
    }
    return;
  }

  PendingReduce reduce;
  reduce.unit = this;
  reduce.params = std::move(trainable);
  reduce.previous = std::move(previous);
  reduce.input = at::empty({world * reduce_numel}, flat_shards_.options().dtype(reduce_dtype_));
  reduce.replicate_after = replicas != nullptr && world > 1;
  {
    TraceScope trace(mesh_.tracer(), "copy", "copy-in", label_);
    const at::Tensor input_2d = reduce.input.view({world, reduce_numel});
    int64_t column = 0;
    for (size_t i = 0; i < reduce.params.size(); ++i) {
      FSDPParam& p = *reduce.params[i];
      const at::Tensor slot = input_2d.narrow(1, column, p.padded_numel());
      if (full_grads[i].defined()) {
        p.copy_chunks_into(full_grads[i], slot);
      } else {
        slot.zero_();  // an unused parameter contributes a zero gradient
      }
      full_grads[i] = at::Tensor();
      column += p.padded_numel();
    }
  }
  stats.add_comm_buffers(reduce.input.nbytes());
  reduce.issued = Tracer::Clock::now();
  try {
    if (world == 1) {
      // No shard dimension (DDP-style replication): the packed gradients are all-reduced
      // across replicas in place.
      reduce.output = reduce.input;
      reduce.op = "all-reduce";
      reduce.work = replicas->all_reduce(reduce.output, ReduceOp::kSum);
    } else {
      reduce.output = at::empty({reduce_numel}, flat_shards_.options().dtype(reduce_dtype_));
      reduce.work =
          mesh_.shard_group().reduce_scatter_tensor(reduce.output, reduce.input, ReduceOp::kSum);
    }
  } catch (const std::exception& e) {
    stats.add_comm_buffers(-reduce.input.nbytes());
    rethrow_with_context("reduce-scatter of gradients", e);
  }
  root_->pending_reduces_.push_back(std::move(reduce));
  // Two in flight let one unit's reduce-scatter run during the next unit's backward while
  // bounding the gradient buffers held to two units' worth.
  root_->finish_reduces(/*keep=*/2);
}

void ParamGroup::finish_reduces(size_t keep) {
  while (pending_reduces_.size() > keep) {
    PendingReduce reduce = std::move(pending_reduces_.front());
    pending_reduces_.pop_front();
    finish_reduce(reduce);
  }
}

void ParamGroup::finish_reduce(PendingReduce& reduce) {
  ParamGroup& unit = *reduce.unit;
  const DeviceMesh& mesh = unit.mesh_;
  unit.wait_for(reduce.work, "reduction of gradients");
  const int64_t input_bytes = reduce.input.nbytes();
  mesh.tracer().complete("comm", reduce.op, reduce.issued, reduce.work->finished_at(), unit.label_,
                         input_bytes, "comm");
  mesh.stats().add_comm_buffers(-input_bytes);
  reduce.input = at::Tensor();
  if (reduce.replicate_after) {
    // HSDP: this rank's reduced shard, summed over the replicas holding the same shard.
    const auto issued = Tracer::Clock::now();
    WorkHandle across = mesh.replicate_group()->all_reduce(reduce.output, ReduceOp::kSum);
    unit.wait_for(across, "all-reduce of gradients across replicas");
    mesh.tracer().complete("comm", "all-reduce", issued, across->finished_at(), unit.label_,
                           reduce.output.nbytes(), "comm");
  }
  reduce.output.div_(mesh.shard_size() * mesh.replicate_size());
  // Sharded gradients live in the master (sharded parameter) dtype.
  const at::Tensor reduced = reduce.output.to(unit.flat_shards_.scalar_type());
  int64_t offset = 0;
  for (size_t i = 0; i < reduce.params.size(); ++i) {
    FSDPParam& p = *reduce.params[i];
    at::Tensor grad = alias_of(reduced, offset, p.layout().padded_shape(p.global_shape()));
    if (reduce.previous[i].defined()) grad.add_(reduce.previous[i]);
    p.param().mutable_grad() = grad;
    offset += p.padded_numel();
  }
}

void ParamGroup::end_of_backward() {
  end_of_backward_queued_ = false;
  for (auto it = forward_order_.rbegin(); it != forward_order_.rend(); ++it) {
    (*it)->post_backward();
  }
  if (is_last_backward_) finish_reduces(/*keep=*/0);
  for (ParamGroup* unit : units_) {
    if (unit->reshard_after_backward_) {
      unit->reshard();  // also completes gathers prefetched for units that never ran
    } else {
      unit->drop_pending_gather();
    }
    unit->state_ = UnitState::kIdle;
  }
}

void ParamGroup::issue_unshard() {
  if (unsharded_ || pending_gather_ != nullptr) return;
  const int world = mesh_.shard_size();
  const bool cast = compute_dtype_ != flat_shards_.scalar_type();
  if (params_.empty() || (world == 1 && !cast)) {
    // Nothing to gather: with one rank the shard is the parameter, so no bytes are added (and
    // none are counted).
    for (auto& p : params_) p.unshard_single_rank();
    unsharded_ = true;
    mesh_.stats().add_unsharded_units(1);
    return;
  }
  auto pending = std::make_unique<PendingGather>();
  ProcessGroup* group = &mesh_.shard_group();
  if (post_forward_piece_.defined()) {
    // hpZ: gather the pieces of this rank's post-forward group, whose [N, W/N * S] output is
    // the same [W, S] buffer a gather over the shard group would give.
    group = post_forward_group_.get();
    pending->piece_bytes = post_forward_piece_.nbytes();
    pending->input = std::move(post_forward_piece_);  // leaves the piece undefined
  } else if (cast) {
    TraceScope trace(mesh_.tracer(), "copy", "copy-in", label_);
    pending->input = flat_shards_.to(compute_dtype_);
  }
  pending->buffer =
      at::empty({world * flat_shards_.numel()}, flat_shards_.options().dtype(compute_dtype_));
  mesh_.stats().add_comm_buffers(pending->buffer.nbytes());
  mesh_.stats().add_unsharded_units(1);
  pending->issued = Tracer::Clock::now();
  try {
    pending->work = group->all_gather_into_tensor(
        pending->buffer, pending->input.defined() ? pending->input : flat_shards_);
  } catch (const std::exception& e) {
    uncount_gather(*pending, /*gathered=*/false);
    rethrow_with_context("all-gather of parameters", e);
  }
  pending_gather_ = std::move(pending);
}

void ParamGroup::wait_unshard() {
  if (unsharded_) return;
  issue_unshard();
  if (unsharded_) return;
  std::unique_ptr<PendingGather> pending = std::move(pending_gather_);
  RankStats& stats = mesh_.stats();
  const int64_t buffer_bytes = pending->buffer.nbytes();
  try {
    wait_for(pending->work, "all-gather of parameters");
  } catch (...) {
    uncount_gather(*pending, /*gathered=*/false);
    throw;
  }
  mesh_.tracer().complete("comm", "all-gather", pending->issued, pending->work->finished_at(),
                          label_, buffer_bytes, "comm");
  {
    TraceScope trace(mesh_.tracer(), "copy", "copy-out", label_);
    const at::Tensor gathered_2d = pending->buffer.view({mesh_.shard_size(), flat_shards_.numel()});
    int64_t column = 0;
    for (auto& p : params_) {
      p.unshard_from(gathered_2d, column);
      stats.add_unsharded_params(p.unsharded_bytes());
      column += p.padded_numel();
    }
  }
  uncount_gather(*pending, /*gathered=*/true);
  unsharded_ = true;
}

void ParamGroup::drop_pending_gather() {
  if (pending_gather_ == nullptr) return;
  // A prefetched all-gather whose unit did not run: complete it (every rank issued it) and
  // drop the result.
  std::unique_ptr<PendingGather> pending = std::move(pending_gather_);
  uncount_gather(*pending, /*gathered=*/false);
  wait_for(pending->work, "all-gather of parameters");
}

void ParamGroup::uncount_gather(const PendingGather& pending, bool gathered) {
  RankStats& stats = mesh_.stats();
  stats.add_comm_buffers(-pending.buffer.nbytes());
  stats.add_unsharded_params(-pending.piece_bytes);
  // A completed gather leaves the unit unsharded; any other ends its count.
  if (!gathered) stats.add_unsharded_units(-1);
}

void ParamGroup::reshard() {
  drop_pending_gather();
  drop_post_forward_piece();
  if (!unsharded_) return;
  const bool counted = mesh_.shard_size() > 1;
  for (auto& p : params_) {
    if (p.is_unsharded() && counted) mesh_.stats().add_unsharded_params(-p.unsharded_bytes());
    p.reshard();
  }
  unsharded_ = false;
  mesh_.stats().add_unsharded_units(-1);
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
  torch::autograd::variable_list routed =
      PostBackwardFunction::apply(group, at::TensorList(needing_grad));
  for (size_t k = 0; k < positions.size(); ++k) inputs[positions[k]] = routed[k];
  return inputs;
}

void ForwardScope::finish(std::vector<at::Tensor>& outputs) {
  group_.post_forward(outputs);
  finished_ = true;
}

}  // namespace fsdp::detail
