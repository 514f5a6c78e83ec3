// The FSDP unit state machine; see param_group.h for its two states and their transitions, and
// the overlap scheme.
//
// Invariants: training_state_ and sharded_state_ change only in set_training_state and
// set_sharded_state; pending_gather_ is set exactly in kGathering and post_forward_piece_
// defined exactly in kPostForwardPiece. Every byte a unit allocates or frees for unsharded
// parameters, full gradients and communication buffers is reported to the rank's stats as it
// happens.
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

#include <algorithm>

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

}  // namespace

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
  flat_shards_ = at::empty({total}, at::TensorOptions().dtype(dtype).device(mesh_.device()));
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

void ParamGroup::check_not_in_backward(const char* setting) const {
  // From the root's training forward to the end of its backward, units act on these settings
  // at different times; a change in between would leave ranks or units disagreeing.
  TORCH_CHECK(!tree().step_in_progress(), "fsdp: ", setting, " called on unit '", label_,
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
  own_root_.set_is_last_backward(last);
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
    for (ParamGroup* unit : backward_prefetch_) unit->issue_unshard();
    return;
  }
  const int count = tree().implicit_prefetch();
  if (count == 0 || forward_index_ < 0) return;
  const auto& order = root_->forward_order();
  for (int k = 1; k <= count && forward_index_ - k >= 0; ++k) {
    ParamGroup* unit = order[forward_index_ - k];
    // Only units whose backward is still to come; the root gathers once, in forward.
    if (unit->training_state_ == TrainingState::kAwaitingBackward) unit->issue_unshard();
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
  issue_unshard();
  prefetch_backward();
  wait_unshard();
  for (auto& p : params_) {
    if (!p.requires_grad()) continue;
    p.stashed_grad = p.param().grad();
    p.param().mutable_grad() = at::Tensor();
  }
  set_training_state(TrainingState::kPreBackward);
  compute_begin_ = Tracer::Clock::now();
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
  } else {
    root_->add_reduce(whole_tensor() ? issue_owner_reduces(std::move(grads))
                                     : issue_reduce(std::move(grads)));
  }
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
  const at::ScalarType master_dtype = flat_shards_.scalar_type();
  for (size_t i = 0; i < grads.params.size(); ++i) {
    FSDPParam& p = *grads.params[i];
    const auto shape = p.layout().padded_shape(p.global_shape());
    at::Tensor grad =
        grads.full[i].defined()
            ? alias_of(grads.full[i].to(reduce_dtype_).to(master_dtype).contiguous(), 0, shape)
            : at::zeros(shape, flat_shards_.options());
    if (grads.previous[i].defined()) grad.add_(grads.previous[i]);
    p.param().mutable_grad() = grad;
  }
}

at::Tensor ParamGroup::pack_reduce_input(UnitGrads& grads) {
  const int world = mesh_.shard_size();
  at::Tensor input =
      at::empty({world * grads.reduce_numel}, flat_shards_.options().dtype(reduce_dtype_));
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
  return input;
}

PendingReduce ParamGroup::issue_reduce(UnitGrads grads) {
  const int world = mesh_.shard_size();
  ProcessGroup* replicas = mesh_.replicate_group();
  PendingReduce reduce;
  reduce.unit = this;
  reduce.input = pack_reduce_input(grads);
  reduce.params = std::move(grads.params);
  reduce.previous = std::move(grads.previous);
  reduce.replicate_after = replicas != nullptr && world > 1;
  mesh_.stats().add_comm_buffers(reduce.input.nbytes());
  reduce.issued = Tracer::Clock::now();
  const CollectiveLabel collective_label(label_);
  try {
    if (world == 1) {
      // No shard dimension (DDP-style replication): the packed gradients are all-reduced
      // across replicas in place.
      reduce.output = reduce.input;
      reduce.op = "all-reduce";
      reduce.work = replicas->all_reduce(reduce.output, ReduceOp::kSum);
    } else {
      reduce.output = at::empty({grads.reduce_numel}, flat_shards_.options().dtype(reduce_dtype_));
      reduce.work =
          mesh_.shard_group().reduce_scatter_tensor(reduce.output, reduce.input, ReduceOp::kSum);
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
  wait_for(reduce.work, "reduction of gradients");
  const int64_t input_bytes = reduce.input.nbytes();
  mesh_.tracer().complete("comm", reduce.op, reduce.issued, reduce.work->finished_at(), label_,
                          input_bytes, "comm");
  mesh_.stats().add_comm_buffers(-input_bytes);
  reduce.input = at::Tensor();
  if (reduce.replicate_after) all_reduce_across_replicas(reduce.output);
  reduce.output.div_(mesh_.shard_size() * mesh_.replicate_size());
  // Sharded gradients live in the master (sharded parameter) dtype.
  assign_sharded_grads(reduce.output.to(flat_shards_.scalar_type()), reduce);
}

void ParamGroup::all_reduce_across_replicas(const at::Tensor& reduced) {
  // HSDP: this rank's reduced shard, summed over the replicas holding the same shard.
  const auto issued = Tracer::Clock::now();
  const CollectiveLabel collective_label(label_);
  WorkHandle across = mesh_.replicate_group()->all_reduce(reduced, ReduceOp::kSum);
  wait_for(across, "all-reduce of gradients across replicas");
  mesh_.tracer().complete("comm", "all-reduce", issued, across->finished_at(), label_,
                          reduced.nbytes(), "comm");
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
  if (params_.empty() || (world == 1 && !cast)) {
    unshard_without_gather();
    return;
  }
  auto pending = std::make_unique<PendingGather>();
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
  } else if (cast) {
    TraceScope trace(mesh_.tracer(), "copy", "copy-in", label_);
    pending->input = flat_shards_.to(compute_dtype_);
  }
  pending->buffer =
      at::empty({world * flat_shards_.numel()}, flat_shards_.options().dtype(compute_dtype_));
  mesh_.stats().add_comm_buffers(pending->buffer.nbytes());
  mesh_.stats().add_unsharded_units(1);
  pending->issued = Tracer::Clock::now();
  const CollectiveLabel collective_label(label_);
  try {
    pending->work = group->all_gather_into_tensor(
        pending->buffer, pending->input.defined() ? pending->input : flat_shards_);
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
    wait_for(pending->work, gather_name());
  } catch (...) {
    uncount_gather(*pending, /*gathered=*/false);
    set_sharded_state(ShardedState::kSharded);
    throw;
  }
  mesh_.tracer().complete("comm", whole_tensor() ? "broadcast" : "all-gather", pending->issued,
                          pending->work->finished_at(), label_, pending->buffer.nbytes(), "comm");
  if (whole_tensor()) {
    copy_out_broadcasts(*pending);
  } else {
    copy_out(pending->buffer);
  }
  uncount_gather(*pending, /*gathered=*/true);
  set_sharded_state(ShardedState::kUnsharded);
}

void ParamGroup::copy_out(const at::Tensor& gathered) {
  TraceScope trace(mesh_.tracer(), "copy", "copy-out", label_);
  const at::Tensor gathered_2d = gathered.view({mesh_.shard_size(), flat_shards_.numel()});
  int64_t column = 0;
  for (auto& p : params_) {
    p.unshard_from(gathered_2d, column);
    mesh_.stats().add_unsharded_params(p.unsharded_bytes());
    column += p.padded_numel();
  }
}

void ParamGroup::drop_pending_gather() {
  if (sharded_state_ != ShardedState::kGathering) return;
  // A prefetched all-gather whose unit did not run: complete it (every rank issued it) and
  // drop the result.
  std::unique_ptr<PendingGather> pending = std::move(pending_gather_);
  uncount_gather(*pending, /*gathered=*/false);
  set_sharded_state(ShardedState::kSharded);
  wait_for(pending->work, gather_name());
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
  free_unsharded_params();
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
