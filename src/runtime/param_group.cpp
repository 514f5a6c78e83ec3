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
// Gradients: pre_backward has the unit's GradientReducer stash the sharded gradients, and
// post_backward hands it the full ones once the unit has resharded (gradient_reducer.h).
#include "runtime/param_group.h"

#include <fsdp/util/error.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace fsdp::detail {
namespace {

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

// FullyShardOptions::ignored_params of every live unit, and every live unit's own parameters
// (with the unit and the parameter's index in it). The units hold the tensors, so an address
// here cannot be reused by another tensor while registered. One mutex guards both: ranks run
// as threads in the tests.
std::mutex registry_mutex;
std::unordered_multiset<const c10::TensorImpl*>& ignored_registry() {
  static std::unordered_multiset<const c10::TensorImpl*> registry;
  return registry;
}
std::unordered_map<const c10::TensorImpl*, std::pair<ParamGroup*, size_t>>& owner_registry() {
  static std::unordered_map<const c10::TensorImpl*, std::pair<ParamGroup*, size_t>> registry;
  return registry;
}

}  // namespace

bool is_ignored_parameter(const at::Tensor& t) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  return ignored_registry().count(t.unsafeGetTensorImpl()) != 0;
}

std::shared_ptr<ParamGroup> ParamGroup::owner_of(const at::Tensor& param, size_t* index) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  const auto it = owner_registry().find(param.unsafeGetTensorImpl());
  if (it == owner_registry().end()) return nullptr;
  *index = it->second.second;
  return it->second.first->weak_from_this().lock();  // null while the unit is being destroyed
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
  // Offloaded state lives on the host; a CPU mesh has it there already.
  const auto& offload = options_.offload_policy();
  offload_to_host_ = offload.has_value() && !mesh_.device().is_cpu();
  flat_shards_ = at::empty(
      {total}, offload_to_host_ ? at::TensorOptions().dtype(dtype).device(at::kCPU).pinned_memory(
                                      offload->pin_memory())
                                : unit_.device_options(dtype));
  int64_t offset = 0;
  for (auto& p : params_) {
    p.init_sharded(flat_shards_.narrow(0, offset, p.padded_numel()));
    offset += p.padded_numel();
  }
  // A whole-tensor placement over one rank is Shard(0)'s: each tensor whole on that rank.
  std::vector<OwnerBucket> buckets;
  if (options_.whole_tensor() && mesh_.shard_size() > 1) {
    buckets = owner_buckets(params_, *options_.whole_tensor());
  }
  const UnsharderArgs args{unit_, params_, flat_shards_, compute_dtype_, offload_to_host_};
  unsharder_ =
      buckets.empty() ? make_shard_unsharder(args) : make_whole_tensor_unsharder(args, buckets);
  reducer_ = std::make_unique<GradientReducer>(
      unit_, params_, flat_shards_, options_.mp_policy().reduce_dtype().value_or(compute_dtype_),
      offload_to_host_, std::move(buckets));
  if (options_.reshard_after_forward().has_value()) {
    // fully_shard checked that the size divides the shard group.
    const int size = options_.reshard_after_forward()->group_size(mesh_.shard_size());
    if (size > 1 && size < mesh_.shard_size() && !params_.empty()) {
      post_forward_group_ = mesh_.post_forward_group(size);
    }
  }
  std::lock_guard<std::mutex> lock(registry_mutex);
  for (const auto& t : options_.ignored_params()) {
    ignored_registry().insert(t.unsafeGetTensorImpl());
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    owner_registry()[params_[i].param().unsafeGetTensorImpl()] = {this, i};
  }
}

ParamGroup::~ParamGroup() {
  std::lock_guard<std::mutex> lock(registry_mutex);
  for (const auto& t : options_.ignored_params()) {
    const auto it = ignored_registry().find(t.unsafeGetTensorImpl());
    if (it != ignored_registry().end()) ignored_registry().erase(it);
  }
  for (const auto& p : params_) {
    const auto it = owner_registry().find(p.param().unsafeGetTensorImpl());
    if (it != owner_registry().end() && it->second.first == this) owner_registry().erase(it);
  }
}

void ParamGroup::add_reduced_gradient(size_t index, at::Tensor addend) {
  TORCH_INTERNAL_ASSERT(index < params_.size(), "fsdp: unit '", label_, "' has no parameter ",
                        index);
  // Idle: this step's post-backward ran, or the unit had no forward this step.
  reducer_->add_reduced_gradient(params_[index], std::move(addend),
                                 training_state_ == TrainingState::kIdle);
}

double ParamGroup::gradient_divide_factor() const { return reducer_->divide_factor(); }

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
  is_top_ = is_top;
  label_ = is_top ? module_->name() + " (root)" : path_;
}

void ParamGroup::join_tree(std::shared_ptr<RootState> tree, const std::string& path, bool is_top) {
  tree_ = std::move(tree);
  in_tree_ = true;
  unit_.bind_streams(tree_->streams());
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

void ParamGroup::set_observer(std::shared_ptr<RuntimeObserver> observer) {
  check_not_in_backward("set_observer");
  // The old observer has this unit's held bytes on its books; only between steps, with nothing
  // held, can the counts move to the new one balanced.
  TORCH_CHECK(sharded_state_ == ShardedState::kSharded && !reducer_->holds_bytes(),
              "fsdp: set_observer called on unit '", label_,
              "' while it holds unsharded parameters or gradients; call it while the unit is "
              "sharded, with no gradients kept unsynced");
  options_.observer(std::move(observer));
  unit_.bind_observer(observer_or_none(options_.observer()));
  // The tree's streams report to the root's observer (before lazy init, each unit is the root
  // of a tree of its own).
  if (!in_tree_ || is_root()) tree().streams().bind_observer(observer_or_none(options_.observer()));
}

void ParamGroup::set_requires_gradient_sync(bool sync) {
  check_not_in_backward("set_requires_gradient_sync", sync);
  reducer_->set_requires_gradient_sync(sync);
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

void ParamGroup::set_custom_all_gather(std::shared_ptr<AllGather> hook) {
  check_not_in_backward("set_custom_all_gather");
  if (hook != nullptr) check_hooks_fit("set_custom_all_gather");
  unsharder_->set_all_gather_hook(std::move(hook));
}

void ParamGroup::set_custom_reduce_scatter(std::shared_ptr<ReduceScatter> hook) {
  check_not_in_backward("set_custom_reduce_scatter");
  if (hook != nullptr) check_hooks_fit("set_custom_reduce_scatter");
  reducer_->set_reduce_scatter_hook(std::move(hook));
}

void ParamGroup::check_hooks_fit(const char* setting) const {
  // A whole-tensor unit moves each tensor with broadcasts to and reduces from its owner: there
  // is no all-gather or reduce-scatter for a hook to replace.
  TORCH_CHECK(!options_.whole_tensor(), "fsdp: unit '", label_, "': ", setting,
              " needs the all-gather / reduce-scatter of Shard(0) placement, but this unit was "
              "sharded with whole_tensor (it broadcasts and reduces whole tensors instead)");
}

void ParamGroup::check_root_only(const char* setter) const {
  // Before any tree exists, a unit nested in another fully_shard'ed module will join that
  // module's tree, whose root's state is the one read.
  const bool root = in_tree_ ? is_root() : is_top_;
  TORCH_CHECK(root, "fsdp: ", setter, " called on unit '", label_,
              "', which is not the root of its tree (",
              in_tree_ ? "the root is '" + tree().root().label() + "'"
                       : std::string("it is nested in another fully_shard'ed module"),
              "): it sets state of the whole tree, which only the root's FSDPModule changes; call "
              "it on the outermost fully_shard'ed module");
}

void ParamGroup::set_implicit_prefetch(int count) {
  check_root_only("set_implicit_prefetch");
  tree().set_implicit_prefetch(count);
}

void ParamGroup::set_is_last_backward(bool last) {
  check_root_only("set_is_last_backward");
  check_not_in_backward("set_is_last_backward", last);
  tree().set_is_last_backward(last);
}

void ParamGroup::set_unshard_in_backward(bool unshard) {
  check_not_in_backward("set_unshard_in_backward", unshard);
  unshard_in_backward_ = unshard;
}

void ParamGroup::set_requires_all_reduce(bool all_reduce) {
  check_not_in_backward("set_requires_all_reduce", all_reduce);
  reducer_->set_requires_all_reduce(all_reduce);
}

void ParamGroup::set_gradient_divide_factor(double factor) {
  check_not_in_backward("set_gradient_divide_factor");
  reducer_->set_gradient_divide_factor(factor);
}

void ParamGroup::set_force_sum_reduction_for_comms(bool enable) {
  check_not_in_backward("set_force_sum_reduction_for_comms", enable);
  reducer_->set_force_sum_reduction_for_comms(enable);
}

void ParamGroup::set_all_reduce_hook(std::function<void(at::Tensor&)> hook) {
  check_not_in_backward("set_all_reduce_hook");
  reducer_->set_all_reduce_hook(std::move(hook));
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
  const auto& order = tree().last_forward_order();
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
  const auto& order = tree().forward_order();
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
  if (!in_tree_) tree().lazy_init();
  if (is_root()) tree().begin_step();
  TORCH_CHECK(training_state_ != TrainingState::kForward, "fsdp: unit '", label_,
              "' was called again from inside its own forward");
  const int position = tree().record_forward(this);
  if (forward_index_ < 0) forward_index_ = position;
  issue_unshard();
  prefetch_forward();
  wait_unshard();
  set_training_state(TrainingState::kForward);
  compute_begin_ = RuntimeObserver::Clock::now();
}

void ParamGroup::post_forward(std::vector<at::Tensor>& outputs) {
  unit_.span("compute", "forward", compute_begin_, RuntimeObserver::Clock::now());
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
  reducer_->stash_sharded_grads();
  set_training_state(TrainingState::kPreBackward);
  compute_begin_ = RuntimeObserver::Clock::now();
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
    unit_.span("compute", "backward", compute_begin_, RuntimeObserver::Clock::now());
  }
  if (backward_ran && (unsharded_phase_ != nullptr || reducer_->reduces_gradients())) {
    DeviceStreams::Op op(tree().streams(), ScheduleStream::kCompute, ScheduleOpKind::kBackward,
                         label_);
    if (unsharded_phase_ != nullptr) op.reads("unsharded", unsharded_phase_);
    op.writes("grad");
  }
  UnitGrads grads = reducer_->take_grads(backward_ran);
  // The unit's full gradients are alive together with its full parameters at this point, the
  // unit's peak: record it, then release both.
  unit_.held(HeldKind::kUnshardedGrads, grads.full_bytes);
  if (reshard_after_backward_) reshard();
  unit_.held(HeldKind::kUnshardedGrads, -grads.full_bytes);
  set_training_state(TrainingState::kIdle);
  if (grads.params.empty()) return;
  if (std::optional<PendingReduce> reduce = reducer_->reduce(std::move(grads))) {
    tree().add_reduce(std::move(*reduce));
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
  const bool from_piece = sharded_state_ == ShardedState::kPostForwardPiece;
  if (from_piece) {
    // hpZ: gather the pieces of this rank's post-forward group, whose [N, W/N * S] output is
    // the same [W, S] buffer a gather over the shard group would give.
    pending->group = post_forward_group_.get();
    pending->piece_bytes = post_forward_piece_.nbytes();
    pending->piece_ready = piece_ready_;
    pending->input = std::move(post_forward_piece_);  // leaves the piece undefined
  }
  try {
    unsharder_->issue(*pending);
  } catch (...) {
    // A piece handed to the failed gather is gone with it.
    if (from_piece) set_sharded_state(ShardedState::kSharded);
    throw;
  }
  pending_gather_ = std::move(pending);
  set_sharded_state(ShardedState::kGathering);
}

void ParamGroup::unshard_without_gather() {
  // Nothing to gather: with one rank the shard is the parameter, so no bytes are added (and
  // none are counted).
  for (auto& p : params_) p.unshard_single_rank();
  set_sharded_state(ShardedState::kUnsharded);
  unit_.held(HeldKind::kUnshardedUnits, 1);
}

void ParamGroup::wait_unshard() {
  if (sharded_state_ == ShardedState::kUnsharded) return;
  issue_unshard();
  if (sharded_state_ == ShardedState::kUnsharded) return;
  std::unique_ptr<PendingGather> pending = std::move(pending_gather_);
  try {
    unsharded_phase_ = unsharder_->complete(*pending);
  } catch (...) {
    set_sharded_state(ShardedState::kSharded);
    throw;
  }
  set_sharded_state(ShardedState::kUnsharded);
}

void ParamGroup::drop_pending_gather() {
  if (sharded_state_ != ShardedState::kGathering) return;
  // A prefetched all-gather whose unit did not run: complete it (every rank issued it) and
  // drop the result.
  std::unique_ptr<PendingGather> pending = std::move(pending_gather_);
  set_sharded_state(ShardedState::kSharded);
  unsharder_->drop(*pending);
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
      unit_.held(HeldKind::kUnshardedParams, -p.unsharded_bytes());
    }
    p.reshard();
  }
  unit_.held(HeldKind::kUnshardedUnits, -1);
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
  at::Tensor piece = at::empty({shards * numel}, unit_.device_options(compute_dtype_));
  {
    SpanScope trace(unit_, "copy", "copy-in");
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
  unit_.held(HeldKind::kUnshardedParams, post_forward_piece_.nbytes());
}

void ParamGroup::drop_post_forward_piece() {
  if (sharded_state_ != ShardedState::kPostForwardPiece) return;
  unit_.held(HeldKind::kUnshardedParams, -post_forward_piece_.nbytes());
  post_forward_piece_ = at::Tensor();
  set_sharded_state(ShardedState::kSharded);
}

}  // namespace fsdp::detail
