// The FSDP unit state machine; see param_group.h for its two states and their transitions, and
// the overlap scheme.
//
// Invariants: training_state_ and sharded_state_ change only in set_training_state and
// set_sharded_state; pending_gather_ is set exactly in kGathering and post_forward_piece_
// defined exactly in kPostForwardPiece. Every byte a unit allocates or frees for unsharded
// parameters, full gradients and communication buffers is reported to the rank's stats as it
// happens.
//
// Streams: every step that hands work to another stream is a DeviceStreams::Op on the role
// stream_schedule.h gives it (copy-in, all-gather, copy-out, forward, reshard, backward, gradient
// copy-in, reduce-scatter, all-reduce, finish), which waits on the events of what it reads and
// records one for its readers. On CPU those are no-ops and each collective's Work is waited on
// where its result is needed, exactly as before streams; on a device the collective's stream is
// ordered after the Work at issue and readers wait on its event instead.
//
// Gradient flow of one unit in backward: autograd accumulates full gradients into the
// (unsharded) parameters; post_backward copies them into one flat [W, S] buffer (S = the
// unit's padded shard numel over trainable parameters), reduce-scatters it (and, HSDP,
// all-reduces the [S] output across replicas), scales it by FSDP2's divide rules
// (gradient_reduction.h: by default the collectives average) and hands each parameter a sharded
// gradient that is a view of the [S] output. A sharded gradient
// left from an earlier backward (accumulation without zero_grad) is stashed in pre_backward,
// because AccumulateGrad would otherwise try to add a full gradient to it, and added back in
// post_backward.
#include "runtime/param_group.h"

#include "runtime/custom_collectives.h"

#include <fsdp/util/error.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <c10/util/strides.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <unordered_set>

namespace fsdp::detail {
namespace {

// A tensor over [offset, offset + numel(shape)) of flat's storage that is not an autograd
// view of flat: optimizers detach_() gradients in zero_grad, which views do not allow.
at::Tensor alias_of(const at::Tensor& flat, int64_t offset, c10::IntArrayRef shape) {
  at::NoGradGuard no_grad;
  at::Tensor alias = at::empty({0}, flat.options());
  alias.set_(flat.storage(), flat.storage_offset() + offset, shape, c10::contiguous_strides(shape));
  return alias;
}

bool is_legal(TrainingState from, TrainingState to) {
  switch (to) {
    case TrainingState::kIdle:
      return true;  // the clean-up paths (abort, a step without backward) come from anywhere
    case TrainingState::kForward:
      return from != TrainingState::kForward;
    case TrainingState::kAwaitingBackward:
      return from == TrainingState::kForward;
    case TrainingState::kPreBackward:
      return from == TrainingState::kAwaitingBackward;
  }
  return false;
}

bool is_legal(ShardedState from, ShardedState to) {
  switch (from) {
    case ShardedState::kSharded:
      return to == ShardedState::kGathering || to == ShardedState::kUnsharded;
    case ShardedState::kGathering:
      return to == ShardedState::kUnsharded || to == ShardedState::kSharded;
    case ShardedState::kUnsharded:
      return to == ShardedState::kSharded || to == ShardedState::kPostForwardPiece;
    case ShardedState::kPostForwardPiece:
      return to == ShardedState::kGathering || to == ShardedState::kSharded;
  }
  return false;
}

// FullyShardOptions::ignored_params of every live unit. The units hold the tensors, so an
// address here cannot be reused by another tensor while registered.
std::mutex ignored_mutex;
std::unordered_multiset<const c10::TensorImpl*>& ignored_registry() {
  static std::unordered_multiset<const c10::TensorImpl*> registry;
  return registry;
}

}  // namespace

bool is_ignored_parameter(const at::Tensor& t) {
  std::lock_guard<std::mutex> lock(ignored_mutex);
  return ignored_registry().count(t.unsafeGetTensorImpl()) != 0;
}

const char* to_string(TrainingState state) {
  switch (state) {
    case TrainingState::kIdle:
      return "kIdle";
    case TrainingState::kForward:
      return "kForward";
    case TrainingState::kAwaitingBackward:
      return "kAwaitingBackward";
    case TrainingState::kPreBackward:
      return "kPreBackward";
  }
  return "?";
}

const char* to_string(ShardedState state) {
  switch (state) {
    case ShardedState::kSharded:
      return "kSharded";
    case ShardedState::kGathering:
      return "kGathering";
    case ShardedState::kUnsharded:
      return "kUnsharded";
    case ShardedState::kPostForwardPiece:
      return "kPostForwardPiece";
  }
  return "?";
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
  // Offloaded state lives on the host; a CPU mesh has it there already.
  const auto& offload = options_.offload_policy();
  offload_to_host_ = offload.has_value() && !mesh_.device().is_cpu();
  flat_shards_ = at::empty(
      {total}, offload_to_host_ ? at::TensorOptions().dtype(dtype).device(at::kCPU).pinned_memory(
                                      offload->pin_memory())
                                : device_options(dtype));
  int64_t offset = 0;
  for (auto& p : params_) {
    p.init_sharded(flat_shards_.narrow(0, offset, p.padded_numel()));
    offset += p.padded_numel();
  }
  if (options_.whole_tensor() && mesh_.shard_size() > 1) build_owner_buckets();
  if (options_.reshard_after_forward().has_value()) {
    // fully_shard checked that the size divides the shard group.
    const int size = options_.reshard_after_forward()->group_size(mesh_.shard_size());
    if (size > 1 && size < mesh_.shard_size() && !params_.empty()) {
      post_forward_group_ = mesh_.post_forward_group(size);
    }
  }
  std::lock_guard<std::mutex> lock(ignored_mutex);
  for (const auto& t : options_.ignored_params()) {
    ignored_registry().insert(t.unsafeGetTensorImpl());
  }
}

ParamGroup::~ParamGroup() {
  std::lock_guard<std::mutex> lock(ignored_mutex);
  for (const auto& t : options_.ignored_params()) {
    const auto it = ignored_registry().find(t.unsafeGetTensorImpl());
    if (it != ignored_registry().end()) ignored_registry().erase(it);
  }
}

// ---- The two states ----

void ParamGroup::set_training_state(TrainingState to) {
  TORCH_INTERNAL_ASSERT(is_legal(training_state_, to), "fsdp: unit '", label_,
                        "' cannot go from training state ", to_string(training_state_), " to ",
                        to_string(to));
  training_state_ = to;
}

void ParamGroup::set_sharded_state(ShardedState to) {
  TORCH_INTERNAL_ASSERT(is_legal(sharded_state_, to), "fsdp: unit '", label_,
                        "' cannot go from sharded state ", to_string(sharded_state_), " to ",
                        to_string(to));
  TORCH_INTERNAL_ASSERT((pending_gather_ != nullptr) == (to == ShardedState::kGathering),
                        "fsdp: unit '", label_, "' enters ", to_string(to),
                        pending_gather_ != nullptr ? " with" : " without",
                        " an all-gather in flight");
  TORCH_INTERNAL_ASSERT(post_forward_piece_.defined() == (to == ShardedState::kPostForwardPiece),
                        "fsdp: unit '", label_, "' enters ", to_string(to),
                        post_forward_piece_.defined() ? " with" : " without",
                        " a post-forward piece");
  sharded_state_ = to;
}

// ---- Naming, settings and the tree ----

void ParamGroup::set_path(const std::string& path, bool is_top) {
  path_ = path;
  label_ = is_top ? module_->name() + " (root)" : path_;
}

void ParamGroup::join_tree(RootState* root, const std::string& path, bool is_top) {
  root_ = root;
  set_path(path, is_top);
}

bool ParamGroup::reshard_after_forward() const {
  const auto& option = options_.reshard_after_forward();
  return option.has_value() ? option->frees_after_forward() : !is_root();
}

std::vector<ParamGroup*> ParamGroup::units_under() const {
  std::vector<ParamGroup*> units;
  for (const auto& m : module_->modules()) {
    if (ParamGroup* unit = param_group_of(*m)) units.push_back(unit);
  }
  return units;
}

void ParamGroup::check_not_in_backward(const char* setter, bool value) const {
  check_not_in_backward((std::string(setter) + (value ? "(true)" : "(false)")).c_str());
}

void ParamGroup::check_not_in_backward(const char* setting) const {
  // From the root's training forward to the end of its backward, units act on these settings
  // at different times; a change in between would leave ranks or units disagreeing.
  TORCH_CHECK(!tree().step_in_progress(), "fsdp: ", setting, " called on unit '", label_,
              "' while a backward pass is running (or pending after forward); change it before "
              "the forward of the micro-batch it applies to");
}

void ParamGroup::set_requires_gradient_sync(bool sync) {
  check_not_in_backward("set_requires_gradient_sync", sync);
  requires_gradient_sync_ = sync;
}

void ParamGroup::set_reshard_after_backward(bool reshard) {
  check_not_in_backward("set_reshard_after_backward", reshard);
  reshard_after_backward_ = reshard;
}

void ParamGroup::set_reshard_after_forward(bool reshard) {
  check_not_in_backward("set_reshard_after_forward", reshard);
  options_.reshard_after_forward(reshard);
  post_forward_group_ = nullptr;  // a bool replaces an int given to fully_shard
}

void ParamGroup::set_schedule_recorder(ScheduleRecorder* recorder) {
  check_not_in_backward(recorder != nullptr ? "set_schedule_recorder(recorder)"
                                            : "set_schedule_recorder(nullptr)");
  tree().streams().set_recorder(recorder);
}

void ParamGroup::set_is_last_backward(bool last) {
  check_not_in_backward("set_is_last_backward", last);
  own_root_.set_is_last_backward(last);
}

void ParamGroup::set_unshard_in_backward(bool unshard) {
  check_not_in_backward("set_unshard_in_backward", unshard);
  unshard_in_backward_ = unshard;
}

void ParamGroup::set_requires_all_reduce(bool all_reduce) {
  check_not_in_backward("set_requires_all_reduce", all_reduce);
  requires_all_reduce_ = all_reduce;
}

void ParamGroup::set_gradient_divide_factor(double factor) {
  check_not_in_backward("set_gradient_divide_factor");
  TORCH_CHECK(std::isfinite(factor) && factor > 0, "fsdp: set_gradient_divide_factor(", factor,
              ") on unit '", label_,
              "': the factor divides the summed gradients and must be finite and > 0");
  gradient_divide_factor_ = factor;
}

void ParamGroup::set_force_sum_reduction_for_comms(bool enable) {
  check_not_in_backward("set_force_sum_reduction_for_comms", enable);
  force_sum_reduction_ = enable;
}

void ParamGroup::set_all_reduce_hook(std::function<void(at::Tensor&)> hook) {
  check_not_in_backward("set_all_reduce_hook");
  all_reduce_hook_ = std::move(hook);
}

GradientReduction ParamGroup::reduction_plan() const {
  return plan_gradient_reduction(mesh_.shard_size(), mesh_.replicate_size(), reduce_dtype_,
                                 gradient_divide_factor_, force_sum_reduction_);
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

void ParamGroup::reset_for_step() {
  if (training_state_ != TrainingState::kIdle) {
    reshard();
    set_training_state(TrainingState::kIdle);
  }
  last_forward_index_ = -1;
  forward_index_ = -1;
}

void ParamGroup::finish_backward() {
  if (reshard_after_backward_) {
    reshard();  // also completes gathers prefetched for units that never ran
  } else {
    drop_pending_gather();
  }
  set_training_state(TrainingState::kIdle);
}

// ---- Prefetching ----

void ParamGroup::prefetch_forward() {
  if (!forward_prefetch_.empty()) {
    for (ParamGroup* unit : forward_prefetch_) unit->issue_unshard();
    return;
  }
  const int count = tree().implicit_prefetch();
  if (count == 0 || last_forward_index_ < 0) return;
  const auto& order = root_->last_forward_order();
  for (int k = 1; k <= count && last_forward_index_ + k < static_cast<int>(order.size()); ++k) {
    order[last_forward_index_ + k]->issue_unshard();
  }
}

void ParamGroup::prefetch_backward() {
  if (!backward_prefetch_.empty()) {
    for (ParamGroup* unit : backward_prefetch_) {
      if (unit->unshard_in_backward_) unit->issue_unshard();
    }
    return;
  }
  const int count = tree().implicit_prefetch();
  if (count == 0 || forward_index_ < 0) return;
  const auto& order = root_->forward_order();
  for (int k = 1; k <= count && forward_index_ - k >= 0; ++k) {
    ParamGroup* unit = order[forward_index_ - k];
    // Only units whose backward is still to come; the root gathers once, in forward.
    if (unit->training_state_ == TrainingState::kAwaitingBackward && unit->unshard_in_backward_) {
      unit->issue_unshard();
    }
  }
}

// ---- Forward ----

void ParamGroup::pre_forward() {
  if (root_ == nullptr) own_root_.lazy_init();
  if (is_root()) root_->begin_step();
  TORCH_CHECK(training_state_ != TrainingState::kForward, "fsdp: unit '", label_,
              "' was called again from inside its own forward");
  const int position = root_->record_forward(this);
  if (forward_index_ < 0) forward_index_ = position;
  issue_unshard();
  prefetch_forward();
  wait_unshard();
  set_training_state(TrainingState::kForward);
  compute_begin_ = Tracer::Clock::now();
}

void ParamGroup::post_forward(std::vector<at::Tensor>& outputs) {
  mesh_.tracer().complete("compute", "forward", compute_begin_, Tracer::Clock::now(), label_);
  if (unsharded_phase_ != nullptr) {
    DeviceStreams::Op(tree().streams(), ScheduleStream::kCompute, ScheduleOpKind::kForward, label_)
        .reads("unsharded", unsharded_phase_);
  }
  if (const auto dtype = options_.mp_policy().output_dtype()) {
    for (auto& out : outputs) {
      if (out.defined() && out.is_floating_point()) out = out.to(*dtype);
    }
  }
  const bool training = at::GradMode::is_enabled();
  if (training) register_pre_backward(*this, outputs);
  if (!training) {
    reshard();
  } else if (reshard_after_forward()) {
    if (post_forward_group_) {
      reshard_to_post_forward_group();
    } else {
      reshard();
    }
  }
  set_training_state(training ? TrainingState::kAwaitingBackward : TrainingState::kIdle);
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
  set_training_state(TrainingState::kIdle);
}

// ---- Backward ----

void ParamGroup::pre_backward() {
  // A later output's hook, or no forward.
  if (training_state_ != TrainingState::kAwaitingBackward) return;
  tree().queue_end_of_backward();
  // An all-gather already in flight is completed even without unshard_in_backward (FSDP2).
  if (unshard_in_backward_ || sharded_state_ == ShardedState::kUnsharded ||
      sharded_state_ == ShardedState::kGathering) {
    issue_unshard();
    prefetch_backward();
    wait_unshard();
  } else {
    skip_unshard_for_backward();
    prefetch_backward();
  }
  for (auto& p : params_) {
    if (!p.requires_grad()) continue;
    p.stashed_grad = p.param().grad();
    p.param().mutable_grad() = at::Tensor();
  }
  set_training_state(TrainingState::kPreBackward);
  compute_begin_ = Tracer::Clock::now();
}

void ParamGroup::skip_unshard_for_backward() {
  drop_post_forward_piece();  // hpZ: nothing will gather from it
  for (const auto& p : params_) {
    // FSDP2 checks nothing here and backward would read freed memory; the saved view is
    // visible as a second reference to the freed storage.
    TORCH_CHECK(!p.unsharded_storage_referenced(), "fsdp: unit '", label_,
                "' has set_unshard_in_backward(false), but its backward reads parameter '",
                p.name(),
                "': autograd saved it in forward, and its values were freed after forward. Keep "
                "set_unshard_in_backward(true) for this unit (or reshard_after_forward false)");
  }
}

void ParamGroup::post_backward() {
  if (training_state_ != TrainingState::kAwaitingBackward &&
      training_state_ != TrainingState::kPreBackward) {
    return;
  }
  const bool backward_ran = training_state_ == TrainingState::kPreBackward;
  if (backward_ran) {
    mesh_.tracer().complete("compute", "backward", compute_begin_, Tracer::Clock::now(), label_);
  }
  if (backward_ran && (unsharded_phase_ != nullptr || reduces_gradients())) {
    DeviceStreams::Op op(tree().streams(), ScheduleStream::kCompute, ScheduleOpKind::kBackward,
                         label_);
    if (unsharded_phase_ != nullptr) op.reads("unsharded", unsharded_phase_);
    op.writes("grad");
  }
  UnitGrads grads = take_grads(backward_ran);
  // The unit's full gradients are alive together with its full parameters at this point, the
  // unit's peak: record it, then release both.
  RankStats& stats = mesh_.stats();
  stats.add_unsharded_grads(grads.full_bytes);
  if (reshard_after_backward_) reshard();
  stats.add_unsharded_grads(-grads.full_bytes);
  set_training_state(TrainingState::kIdle);
  if (grads.params.empty()) return;

  add_unsynced_grads(grads);
  if (!requires_gradient_sync_) {
    keep_unsynced_grads(grads);
  } else if (mesh_.shard_size() == 1 && mesh_.replicate_group() == nullptr) {
    assign_single_rank_grads(grads);
  } else if (mesh_.shard_size() == 1 && !requires_all_reduce_) {
    // Replicas only and no all-reduce: nothing to communicate; the packed gradients join the
    // partial sum (FSDP2 copies them to the reduce output and keeps that).
    PendingReduce local;
    StreamEvent packed;
    local.input = pack_reduce_input(grads, packed);
    const double pre_scale = reduction_plan().pre_scale;
    if (pre_scale != 1.0) local.input.mul_(pre_scale);
    local.params = std::move(grads.params);
    local.previous = std::move(grads.previous);
    keep_partial_reduce(local.input, local);
  } else {
    root_->add_reduce(whole_tensor() ? issue_owner_reduces(std::move(grads))
                                     : issue_reduce(std::move(grads)));
  }
}

bool ParamGroup::reduces_gradients() const {
  const bool trainable = std::any_of(params_.begin(), params_.end(),
                                     [](const FSDPParam& p) { return p.requires_grad(); });
  return trainable && requires_gradient_sync_ &&
         (mesh_.shard_size() > 1 || mesh_.replicate_group() != nullptr);
}

ParamGroup::UnitGrads ParamGroup::take_grads(bool backward_ran) {
  UnitGrads grads;
  for (auto& p : params_) {
    if (!p.requires_grad()) continue;
    at::Tensor grad = p.param().grad();
    at::Tensor before = std::move(p.stashed_grad);
    if (!backward_ran) {
      // Pre-backward never ran, so this unit got no gradient this backward: whatever
      // gradient the parameter holds is a sharded one from before.
      before = std::move(grad);
      grad = at::Tensor();
    }
    p.stashed_grad = at::Tensor();
    p.param().mutable_grad() = at::Tensor();
    if (grad.defined()) grads.full_bytes += grad.nbytes();
    grads.params.push_back(&p);
    grads.full.push_back(std::move(grad));
    grads.previous.push_back(std::move(before));
    grads.reduce_numel += p.padded_numel();
  }
  return grads;
}

void ParamGroup::add_unsynced_grads(UnitGrads& grads) {
  // Gradients of earlier backward passes that did not sync are added first, so the sum is
  // formed in the same order as autograd's accumulation in a single process.
  RankStats& stats = mesh_.stats();
  for (size_t i = 0; i < grads.params.size(); ++i) {
    FSDPParam& p = *grads.params[i];
    if (!p.unsynced_grad.defined()) continue;
    stats.add_unsharded_grads(-p.unsynced_grad.nbytes());
    if (grads.full[i].defined()) p.unsynced_grad.add_(grads.full[i]);
    grads.full[i] = std::move(p.unsynced_grad);
    p.unsynced_grad = at::Tensor();
  }
}

void ParamGroup::keep_unsynced_grads(UnitGrads& grads) {
  // No reduction this time: keep the full gradients (in the reduce dtype) for the backward
  // that syncs, and give the parameters back the sharded gradients they had.
  for (size_t i = 0; i < grads.params.size(); ++i) {
    FSDPParam& p = *grads.params[i];
    if (grads.full[i].defined()) {
      p.unsynced_grad = grads.full[i].to(reduce_dtype_).contiguous();
      mesh_.stats().add_unsharded_grads(p.unsynced_grad.nbytes());
    }
    p.param().mutable_grad() = grads.previous[i];
  }
}

void ParamGroup::assign_single_rank_grads(UnitGrads& grads) {
  // One rank: the full gradient is the sharded gradient; nothing to copy or reduce. (Rounding
  // through the reduce dtype is kept, as a one-rank reduction in it would do.)
  // A divide factor or hook applies as to a one-rank reduction: the hook sees the unit's
  // gradients packed into one flat tensor.
  const at::ScalarType master_dtype = flat_shards_.scalar_type();
  const GradientReduction plan = reduction_plan();
  for (auto& full : grads.full) {
    if (!full.defined()) continue;
    full = full.to(reduce_dtype_);
    if (plan.pre_scale != 1.0) full = full.mul(plan.pre_scale);
  }
  if (all_reduce_hook_) {
    std::vector<at::Tensor> flat;
    for (size_t i = 0; i < grads.params.size(); ++i) {
      flat.push_back(grads.full[i].defined() ? grads.full[i].reshape({-1})
                                             : at::zeros({grads.params[i]->padded_numel()},
                                                         device_options(reduce_dtype_)));
    }
    at::Tensor packed = at::cat(flat);
    run_all_reduce_hook(packed);
    int64_t offset = 0;
    for (size_t i = 0; i < grads.params.size(); ++i) {
      const int64_t numel = grads.params[i]->padded_numel();
      grads.full[i] = packed.narrow(0, offset, numel);
      offset += numel;
    }
  }
  for (size_t i = 0; i < grads.params.size(); ++i) {
    FSDPParam& p = *grads.params[i];
    const auto shape = p.layout().padded_shape(p.global_shape());
    at::Tensor full;
    if (grads.full[i].defined()) {
      full = grads.full[i];
      if (plan.post_divide != 1.0) full = full.div(plan.post_divide);
      full = full.to(master_dtype);
      if (offload_to_host_) full = full.to(at::kCPU);
    }
    at::Tensor grad = full.defined() ? alias_of(full.contiguous(), 0, shape)
                                     : at::zeros(shape, flat_shards_.options());
    if (grads.previous[i].defined()) grad.add_(grads.previous[i]);
    p.param().mutable_grad() = grad;
  }
}

at::Tensor ParamGroup::pack_reduce_input(UnitGrads& grads, StreamEvent& packed) {
  // On compute, where autograd wrote the full gradients, so they are freed as soon as copied
  // (FSDP2's order); the reduce-scatter stream waits on `packed`.
  DeviceStreams::Op op(tree().streams(), ScheduleStream::kCompute, ScheduleOpKind::kRsCopyIn,
                       label_);
  op.reads("grad").writes("rs_in").frees("grad");
  const int world = mesh_.shard_size();
  at::Tensor input = allocate_reduce_buffer(reduce_scatter_hook_.get(), world * grads.reduce_numel,
                                            device_options(reduce_dtype_), label_);
  TraceScope trace(mesh_.tracer(), "copy", "copy-in", label_);
  const at::Tensor input_2d = input.view({world, grads.reduce_numel});
  int64_t column = 0;
  for (size_t i = 0; i < grads.params.size(); ++i) {
    FSDPParam& p = *grads.params[i];
    const at::Tensor slot = input_2d.narrow(1, column, p.padded_numel());
    if (grads.full[i].defined()) {
      p.copy_chunks_into(grads.full[i], slot);
    } else {
      slot.zero_();  // an unused parameter contributes a zero gradient
    }
    grads.full[i] = at::Tensor();
    column += p.padded_numel();
  }
  packed = op.record("rs_copied_in");
  return input;
}

PendingReduce ParamGroup::issue_reduce(UnitGrads grads) {
  const int world = mesh_.shard_size();
  ProcessGroup* replicas = mesh_.replicate_group();
  PendingReduce reduce;
  reduce.unit = this;
  reduce.input = pack_reduce_input(grads, reduce.packed);
  reduce.params = std::move(grads.params);
  reduce.previous = std::move(grads.previous);
  const GradientReduction plan = reduction_plan();
  reduce.keep_partial = replicas != nullptr && !requires_all_reduce_;
  reduce.replicate_after = replicas != nullptr && world > 1 && requires_all_reduce_;
  reduce.all_reduce_op = plan.all_reduce_op;
  reduce.post_divide = plan.post_divide;
  mesh_.stats().add_comm_buffers(reduce.input.nbytes());
  reduce.issued = Tracer::Clock::now();
  const CollectiveLabel collective_label(label_);
  DeviceStreams& streams = tree().streams();
  streams.flush(ScheduleStream::kReduceScatter);
  try {
    if (world == 1) {
      // No shard dimension (DDP-style replication): the packed gradients are all-reduced
      // across replicas in place.
      DeviceStreams::Op op(streams, ScheduleStream::kAllReduce, ScheduleOpKind::kAllReduce, label_);
      op.wait(reduce.packed).reads("rs_in").writes("rs_in");
      reduce.output = reduce.input;
      if (plan.pre_scale != 1.0) reduce.output.mul_(plan.pre_scale);
      if (partial_reduce_output_.defined()) {
        reduce.output.add_(partial_reduce_output_);
        mesh_.stats().add_comm_buffers(-partial_reduce_output_.nbytes());
        partial_reduce_output_ = at::Tensor();
      }
      reduce.op = "all-reduce";
      reduce.work = replicas->all_reduce(reduce.output, plan.all_reduce_op);
      order_stream_after(reduce.work);
      reduce.reduced = op.record("reduced");
    } else {
      DeviceStreams::Op op(streams, ScheduleStream::kReduceScatter, ScheduleOpKind::kReduceScatter,
                           label_);
      op.wait(reduce.packed).reads("rs_in").writes("rs_out");
      reduce.output = allocate_reduce_buffer(reduce_scatter_hook_.get(), grads.reduce_numel,
                                             device_options(reduce_dtype_), label_);
      if (plan.pre_scale != 1.0) reduce.input.mul_(plan.pre_scale);
      reduce.work =
          start_reduce_scatter(reduce_scatter_hook_.get(), mesh_.shard_group(), reduce.output,
                               reduce.input, plan.reduce_scatter_op, label_);
      order_stream_after(reduce.work);
      reduce.reduced = op.record("reduced");
    }
  } catch (const std::exception& e) {
    mesh_.stats().add_comm_buffers(-reduce.input.nbytes());
    rethrow_with_context("reduce-scatter of gradients", e);
  }
  return reduce;
}

void ParamGroup::finish_reduce(PendingReduce& reduce) {
  TORCH_INTERNAL_ASSERT(reduce.unit == this, "fsdp: unit '", label_,
                        "' asked to finish another unit's reduction");
  DeviceStreams& streams = tree().streams();
  // With streams, compute waits on the reduction's event below instead of the host here.
  if (streams.in_program_order()) wait_for(reduce.work, "reduction of gradients");
  const int64_t input_bytes = reduce.input.nbytes();
  mesh_.tracer().complete("comm", reduce.op, reduce.issued, reduce.work->finished_at(), label_,
                          input_bytes, "comm");
  mesh_.stats().add_comm_buffers(-input_bytes);
  // In program order the reduction has completed: free its input now, as ever. With streams the
  // input (allocated on compute) is freed once compute has waited on the reduction.
  if (streams.in_program_order()) reduce.input = at::Tensor();
  if (reduce.keep_partial) {
    // On a device the host waits for the reduce-scatter before compute adds its output.
    if (!streams.in_program_order()) wait_for(reduce.work, "reduction of gradients");
    keep_partial_reduce(reduce.output, reduce);
    return;
  }
  const StreamEvent ready =
      reduce.replicate_after
          ? all_reduce_across_replicas(reduce.output, reduce.reduced, reduce.all_reduce_op)
          : reduce.reduced;
  const bool scattered = mesh_.shard_size() > 1;
  StreamEvent finished;
  {
    DeviceStreams::Op op(streams, ScheduleStream::kCompute, ScheduleOpKind::kFinishReduce, label_);
    op.wait(ready).reads(scattered ? "rs_out" : "rs_in").writes("sharded_grad").frees("rs_in");
    reduce.input = at::Tensor();
    // The hook sees the reduced (all-reduced) gradients on compute, after the wait on ready.
    if (all_reduce_hook_) run_all_reduce_hook(reduce.output);
    if (reduce.post_divide != 1.0) reduce.output.div_(reduce.post_divide);
    // Sharded gradients live in the master (sharded parameter) dtype, and with offload on the
    // host. The copy to the host overlaps unless a gradient is accumulated into on the host
    // (FSDP2's rule); end of backward waits for it.
    at::Tensor sharded = reduce.output.to(flat_shards_.scalar_type());
    if (offload_to_host_) {
      const bool accumulates = std::any_of(reduce.previous.begin(), reduce.previous.end(),
                                           [](const at::Tensor& t) { return t.defined(); });
      sharded = sharded.to(sharded.options().device(at::kCPU),
                           /*non_blocking=*/flat_shards_.is_pinned() && !accumulates);
    }
    assign_sharded_grads(sharded, reduce);
    finished = op.record("finished");
  }
  // The output (allocated on the reduce-scatter stream) may live on as the sharded gradients;
  // this drops the runtime's own reference, ordered after the finish (FSDP2 does the same).
  if (scattered) {
    streams.release_after(ScheduleStream::kReduceScatter, std::move(reduce.output), finished,
                          "rs_out", label_);
  }
}

StreamEvent ParamGroup::all_reduce_across_replicas(const at::Tensor& reduced,
                                                   const StreamEvent& after, ReduceOp op_kind) {
  // HSDP: this rank's reduced shard, summed over the replicas holding the same shard.
  const auto issued = Tracer::Clock::now();
  const CollectiveLabel collective_label(label_);
  DeviceStreams& streams = tree().streams();
  DeviceStreams::Op op(streams, ScheduleStream::kAllReduce, ScheduleOpKind::kAllReduce, label_);
  op.wait(after).reads("rs_out").writes("rs_out");
  if (partial_reduce_output_.defined()) {
    // set_requires_all_reduce: the sum of earlier backward passes' reduce-scattered gradients.
    reduced.add_(partial_reduce_output_);
    mesh_.stats().add_comm_buffers(-partial_reduce_output_.nbytes());
    partial_reduce_output_ = at::Tensor();
  }
  WorkHandle across = mesh_.replicate_group()->all_reduce(reduced, op_kind);
  if (streams.in_program_order()) {
    wait_for(across, "all-reduce of gradients across replicas");
  } else {
    try {
      order_stream_after(across);
    } catch (const std::exception& e) {
      rethrow_with_context("all-reduce of gradients across replicas", e);
    }
  }
  mesh_.tracer().complete("comm", "all-reduce", issued, across->finished_at(), label_,
                          reduced.nbytes(), "comm");
  return op.record("all_reduced");
}

void ParamGroup::keep_partial_reduce(const at::Tensor& reduced, const PendingReduce& reduce) {
  if (partial_reduce_output_.defined()) {
    partial_reduce_output_.add_(reduced);
  } else {
    partial_reduce_output_ = reduced;  // a buffer of this reduction's own
    mesh_.stats().add_comm_buffers(partial_reduce_output_.nbytes());
  }
  for (size_t i = 0; i < reduce.params.size(); ++i) {
    reduce.params[i]->param().mutable_grad() = reduce.previous[i];
  }
}

void ParamGroup::run_all_reduce_hook(at::Tensor& reduced) const {
  const auto sizes = reduced.sizes().vec();
  const auto dtype = reduced.scalar_type();
  all_reduce_hook_(reduced);
  TORCH_CHECK(reduced.defined() && reduced.sizes().vec() == sizes &&
                  reduced.scalar_type() == dtype && reduced.device() == mesh_.device(),
              "fsdp: the all-reduce hook of unit '", label_, "' must leave its tensor ", sizes, " ",
              dtype, " on ", mesh_.device(), " as it was (modify it in place), got ",
              reduced.defined()
                  ? c10::str(reduced.sizes(), " ", reduced.scalar_type(), " on ", reduced.device())
                  : std::string("an undefined tensor"));
}

void ParamGroup::assign_sharded_grads(const at::Tensor& reduced, const PendingReduce& reduce) {
  int64_t offset = 0;
  for (size_t i = 0; i < reduce.params.size(); ++i) {
    FSDPParam& p = *reduce.params[i];
    at::Tensor grad = alias_of(reduced, offset, p.layout().padded_shape(p.global_shape()));
    if (reduce.previous[i].defined()) grad.add_(reduce.previous[i]);
    p.param().mutable_grad() = grad;
    offset += p.padded_numel();
  }
}

// ---- Unshard and reshard ----

void ParamGroup::issue_unshard() {
  if (sharded_state_ == ShardedState::kUnsharded || sharded_state_ == ShardedState::kGathering) {
    return;
  }
  const int world = mesh_.shard_size();
  const bool cast = compute_dtype_ != flat_shards_.scalar_type();
  if (params_.empty() || (world == 1 && !cast && !offload_to_host_)) {
    unshard_without_gather();
    return;
  }
  auto pending = std::make_unique<PendingGather>();
  // A gather for backward follows the unit's forward; the schedule names the two apart.
  pending->phase = training_state_ == TrainingState::kAwaitingBackward ? "bwd" : "fwd";
  if (whole_tensor()) {
    issue_broadcasts(*pending);
    pending_gather_ = std::move(pending);
    set_sharded_state(ShardedState::kGathering);
    return;
  }
  ProcessGroup* group = &mesh_.shard_group();
  if (sharded_state_ == ShardedState::kPostForwardPiece) {
    // hpZ: gather the pieces of this rank's post-forward group, whose [N, W/N * S] output is
    // the same [W, S] buffer a gather over the shard group would give.
    group = post_forward_group_.get();
    pending->piece_bytes = post_forward_piece_.nbytes();
    pending->input = std::move(post_forward_piece_);  // leaves the piece undefined
  }
  copy_in(*pending);
  mesh_.stats().add_comm_buffers(pending->buffer.nbytes());
  mesh_.stats().add_unsharded_units(1);
  pending->issued = Tracer::Clock::now();
  try {
    issue_gather(*pending, *group);
  } catch (const std::exception& e) {
    uncount_gather(*pending, /*gathered=*/false);
    // A piece handed to the failed gather is gone with it.
    if (sharded_state_ == ShardedState::kPostForwardPiece) {
      set_sharded_state(ShardedState::kSharded);
    }
    rethrow_with_context("all-gather of parameters", e);
  }
  pending_gather_ = std::move(pending);
  set_sharded_state(ShardedState::kGathering);
}

void ParamGroup::copy_in(PendingGather& pending) {
  DeviceStreams& streams = tree().streams();
  // Earlier gathers' buffers are released first, so the caching allocator can reuse them.
  streams.flush(ScheduleStream::kCopyIn);
  DeviceStreams::Op op(streams, ScheduleStream::kCopyIn, ScheduleOpKind::kCopyIn, label_);
  op.wait_for_step_begin();
  if (pending.piece_bytes > 0) {
    op.wait(piece_ready_).reads("piece");
  } else {
    op.reads("shard");
    const bool cast = compute_dtype_ != flat_shards_.scalar_type();
    if (cast || offload_to_host_) {
      TraceScope trace(mesh_.tracer(), "copy", "copy-in", label_);
      pending.input = offload_to_host_ ? flat_shards_.to(device_options(compute_dtype_),
                                                         /*non_blocking=*/true)
                                       : flat_shards_.to(compute_dtype_);
      op.writes("ag_in", pending.phase);
    }
  }
  pending.buffer =
      allocate_gather_buffer(all_gather_hook_.get(), mesh_.shard_size() * flat_shards_.numel(),
                             device_options(compute_dtype_), label_);
  op.writes("ag_buf", pending.phase);
  pending.copied_in = op.record("copied_in", pending.phase);
}

void ParamGroup::issue_gather(PendingGather& pending, ProcessGroup& group) {
  DeviceStreams::Op op(tree().streams(), ScheduleStream::kAllGather, ScheduleOpKind::kAllGather,
                       label_);
  const bool piece = pending.piece_bytes > 0;
  op.wait(pending.copied_in);
  if (!pending.input.defined()) {
    op.reads("shard");
  } else if (piece) {
    op.reads("piece");
  } else {
    op.reads("ag_in", pending.phase);
  }
  op.writes("ag_buf", pending.phase);
  const CollectiveLabel collective_label(label_);
  pending.work = start_all_gather(all_gather_hook_.get(), group, pending.buffer,
                                  pending.input.defined() ? pending.input : flat_shards_, label_);
  order_stream_after(pending.work);
  pending.gathered = op.record("gathered", pending.phase);
}

void ParamGroup::order_stream_after(const WorkHandle& work) {
  // In program order the host waits where the result is needed (wait_for). With streams the
  // current (guarded) stream waits for the collective, not the host (Work::wait_on_stream).
  if (!tree().streams().in_program_order()) work->wait_on_stream();
}

void ParamGroup::unshard_without_gather() {
  // Nothing to gather: with one rank the shard is the parameter, so no bytes are added (and
  // none are counted).
  for (auto& p : params_) p.unshard_single_rank();
  set_sharded_state(ShardedState::kUnsharded);
  mesh_.stats().add_unsharded_units(1);
}

void ParamGroup::wait_unshard() {
  if (sharded_state_ == ShardedState::kUnsharded) return;
  issue_unshard();
  if (sharded_state_ == ShardedState::kUnsharded) return;
  std::unique_ptr<PendingGather> pending = std::move(pending_gather_);
  try {
    // With streams, copy-out's wait on the gather's event orders compute instead (whole-tensor
    // broadcasts are waited on by the host: their copy-out is not on the stream schedule).
    if (whole_tensor() || tree().streams().in_program_order()) {
      wait_for(pending->work, gather_name());
    }
  } catch (...) {
    uncount_gather(*pending, /*gathered=*/false);
    set_sharded_state(ShardedState::kSharded);
    throw;
  }
  mesh_.tracer().complete("comm", whole_tensor() ? "broadcast" : "all-gather", pending->issued,
                          pending->work->finished_at(), label_, pending->buffer.nbytes(), "comm");
  if (whole_tensor()) {
    copy_out_broadcasts(*pending);
    uncount_gather(*pending, /*gathered=*/true);
    set_sharded_state(ShardedState::kUnsharded);
    return;
  }
  const StreamEvent copied_out = copy_out(*pending);
  uncount_gather(*pending, /*gathered=*/true);
  release_gather(*pending, copied_out);
  set_sharded_state(ShardedState::kUnsharded);
}

StreamEvent ParamGroup::copy_out(PendingGather& pending) {
  StreamEvent copied_out;
  {
    DeviceStreams::Op op(tree().streams(), ScheduleStream::kCompute, ScheduleOpKind::kCopyOut,
                         label_);
    op.wait(pending.gathered).reads("ag_buf", pending.phase).writes("unsharded", pending.phase);
    TraceScope trace(mesh_.tracer(), "copy", "copy-out", label_);
    const at::Tensor gathered_2d = pending.buffer.view({mesh_.shard_size(), flat_shards_.numel()});
    int64_t column = 0;
    for (auto& p : params_) {
      p.unshard_from(gathered_2d, column);
      mesh_.stats().add_unsharded_params(p.unsharded_bytes());
      column += p.padded_numel();
    }
    copied_out = op.record("copied_out", pending.phase);
  }
  unsharded_phase_ = pending.phase;
  return copied_out;
}

void ParamGroup::release_gather(PendingGather& pending, const StreamEvent& last_read) {
  DeviceStreams& streams = tree().streams();
  if (pending.piece_bytes > 0) {
    // The hpZ piece was made on compute; compute has waited on (or now waits on) the gather.
    streams.release_after(ScheduleStream::kCompute, std::move(pending.input), pending.gathered,
                          "piece", label_);
    streams.flush(ScheduleStream::kCompute);
  } else if (pending.input.defined()) {
    streams.release_after(ScheduleStream::kCopyIn, std::move(pending.input), pending.gathered,
                          "ag_in", label_, pending.phase);
  }
  streams.release_after(ScheduleStream::kCopyIn, std::move(pending.buffer), last_read, "ag_buf",
                        label_, pending.phase);
}

void ParamGroup::drop_pending_gather() {
  if (sharded_state_ != ShardedState::kGathering) return;
  // A prefetched all-gather whose unit did not run: complete it (every rank issued it) and
  // drop the result.
  std::unique_ptr<PendingGather> pending = std::move(pending_gather_);
  uncount_gather(*pending, /*gathered=*/false);
  set_sharded_state(ShardedState::kSharded);
  if (whole_tensor()) {
    wait_for(pending->work, gather_name());
    return;
  }
  if (tree().streams().in_program_order()) wait_for(pending->work, gather_name());
  release_gather(*pending, pending->gathered);
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
  if (sharded_state_ != ShardedState::kUnsharded) return;
  {
    DeviceStreams::Op op(tree().streams(), ScheduleStream::kCompute, ScheduleOpKind::kReshard,
                         label_, /*report=*/unsharded_phase_ != nullptr);
    if (unsharded_phase_ != nullptr) op.frees("unsharded", unsharded_phase_);
    free_unsharded_params();
  }
  set_sharded_state(ShardedState::kSharded);
}

void ParamGroup::free_unsharded_params() {
  const bool counted = mesh_.shard_size() > 1;
  for (auto& p : params_) {
    // An owned whole tensor aliases its shard: no bytes of its own were counted.
    if (p.is_unsharded() && counted && !p.aliases_shard()) {
      mesh_.stats().add_unsharded_params(-p.unsharded_bytes());
    }
    p.reshard();
  }
  mesh_.stats().add_unsharded_units(-1);
  unsharded_phase_ = nullptr;
}

void ParamGroup::reshard_to_post_forward_group() {
  const int64_t shards = mesh_.shard_size() / post_forward_group_->size();
  const int64_t first = post_forward_group_->rank() * shards;
  const int64_t numel = flat_shards_.numel();
  DeviceStreams::Op op(tree().streams(), ScheduleStream::kCompute, ScheduleOpKind::kReshard, label_,
                       /*report=*/unsharded_phase_ != nullptr);
  if (unsharded_phase_ != nullptr) {
    op.reads("unsharded", unsharded_phase_).writes("piece").frees("unsharded", unsharded_phase_);
  }
  at::Tensor piece = at::empty({shards * numel}, device_options(compute_dtype_));
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
  // The gather for backward reads the piece on another stream.
  piece_ready_ = op.record("piece_ready");
  free_unsharded_params();
  post_forward_piece_ = std::move(piece);
  set_sharded_state(ShardedState::kPostForwardPiece);
  mesh_.stats().add_unsharded_params(post_forward_piece_.nbytes());
}

void ParamGroup::drop_post_forward_piece() {
  if (sharded_state_ != ShardedState::kPostForwardPiece) return;
  mesh_.stats().add_unsharded_params(-post_forward_piece_.nbytes());
  post_forward_piece_ = at::Tensor();
  set_sharded_state(ShardedState::kSharded);
}

}  // namespace fsdp::detail
