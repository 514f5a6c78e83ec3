// ParamGroup: the state machine of one FSDP unit (one fully_shard call), FSDP2's FSDPParamGroup.
// The tree-wide state (forward order, reductions in flight, end of backward, the tree-wide
// settings) is one RootState (root_state.h) that every unit of the tree shares once the root's
// lazy init has bound it; the hooks that call into a unit are in hooks.cpp. The unit's
// placement (how its parameters are gathered: unsharder.h) and its gradient reduction
// (gradient_reducer.h) are parts of their own that the state machine calls.
//
// A unit has two states, each an enum changed only by its set_*_state function, which asserts
// that the transition is legal:
//
// TrainingState, where the unit is within one training step:
//   kIdle --pre_forward--> kForward --post_forward--> kAwaitingBackward (grad mode on; else kIdle)
//        --pre_backward (hook on an output's grad)--> kPreBackward
//        --post_backward (autograd node on the inputs, or the root's end-of-backward callback
//          for units whose node never ran; also from kAwaitingBackward)--> kIdle
//   Every state may go back to kIdle (an aborted forward, a step that had no backward), and to
//   kForward (a unit called again in the same forward, or from inside a backward). kPreBackward
//   is FSDP2's PRE_BACKWARD (gathered for backward, gradients accumulating); FSDP2 goes back to
//   IDLE after forward, where this unit waits in kAwaitingBackward so that its pre-backward
//   hook and the end-of-backward callback know whether its backward is still to come.
//
// ShardedState, what the unit's parameters hold:
//   kSharded --issue_unshard--> kGathering --wait_unshard--> kUnsharded --reshard--> kSharded
//   kSharded --issue_unshard, nothing to gather (one rank)--> kUnsharded
//   kGathering --drop_pending_gather (a prefetch whose unit never ran)--> kSharded
//   kUnsharded --post_forward with reshard_after_forward = N (hpZ)--> kPostForwardPiece: this
//     rank's 1/N piece of the unsharded parameters, kept until pre_backward gathers from it
//     within a group of N (kPostForwardPiece --issue_unshard--> kGathering), or reshard drops it.
// Parameters are unsharded from pre_forward to post_forward (and to the end of backward when
// reshard_after_forward is false) and from pre_backward to post_backward.
//
// Communication is asynchronous: an unshard is an all-gather issued on the process group's
// progress thread (issue_unshard) and completed, with the copy-out, only when the parameters
// are needed (wait_unshard). Prefetching issues the next unit's all-gather before the current
// unit computes: in forward, the next unit in the previous step's forward order; in backward,
// the unit before the current one in this step's forward order. A unit's reduce-scatter is
// issued in post_backward and completed by the root later (when too many are in flight, or at
// the end of backward), so it overlaps the backward of the units before it.
//
// Every collective is issued by every rank in the same order, because every rank runs the same
// forward and the same autograd graph, and prefetch decisions depend only on that order.
//
// The placement is behind one interface (Unsharder, unsharder.h), chosen once when the unit is
// made, so the state machine does not branch on it: Shard(0)'s all-gather and copy-out
// (shard_unsharder.cpp), or, under a whole-tensor placement (inter-tensor ZeRO-3,
// FullyShardOptions::whole_tensor, W > 1), one broadcast per owner of the unit's tensors
// (whole_tensor_unsharder.cpp). The states and hooks are the same for both; the reduction is
// one reduce per owner instead of the reduce-scatter (gradient_reducer.cpp).
#pragma once

#include "runtime/fsdp_param.h"
#include "runtime/gradient_reducer.h"
#include "runtime/hooks.h"
#include "runtime/root_state.h"
#include "runtime/unit_context.h"
#include "runtime/unsharder.h"

#include <fsdp/comm/comm_hooks.h>
#include <fsdp/device_mesh.h>
#include <fsdp/fully_shard.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::detail {

enum class TrainingState { kIdle, kForward, kAwaitingBackward, kPreBackward };
enum class ShardedState { kSharded, kGathering, kUnsharded, kPostForwardPiece };

// Whether t is in some live unit's FullyShardOptions::ignored_params (clip_grad_norm_ refuses
// them: their gradients are per rank).
bool is_ignored_parameter(const at::Tensor& t);

const char* to_string(TrainingState state);
const char* to_string(ShardedState state);

class ParamGroup : public std::enable_shared_from_this<ParamGroup> {
 public:
  ParamGroup(torch::nn::Module* module, std::vector<FSDPParam> params, DeviceMesh mesh,
             FullyShardOptions options);
  ~ParamGroup();
  ParamGroup(const ParamGroup&) = delete;
  ParamGroup& operator=(const ParamGroup&) = delete;

  // Hooks, called by ForwardScope and autograd (hooks.cpp).
  void pre_forward();
  // Casts outputs to the policy's output_dtype, hooks pre-backward onto them, reshards.
  void post_forward(std::vector<at::Tensor>& outputs);
  // Casts floating-point inputs to param_dtype when the policy asks for it.
  void cast_forward_inputs(std::vector<at::Tensor>& inputs) const;
  void abort_forward();
  void pre_backward();
  // Reduces this backward's gradients into sharded ones; a no-op unless forward or
  // pre-backward ran since the last post-backward.
  void post_backward();

  // Starts the all-gather of this unit's parameters; no-op if unsharded or already in flight.
  void issue_unshard();
  // Completes the unshard (issuing it first if needed): blocks on the all-gather, copies out.
  void wait_unshard();
  // Frees the unsharded parameters; completes and drops an all-gather still in flight.
  void reshard();
  // Completes and drops an all-gather still in flight, keeping unsharded parameters.
  void drop_pending_gather();

  // Explicit prefetch targets (FSDP2's set_modules_to_forward/backward_prefetch). When set,
  // they replace the implicit choice for this unit.
  void set_forward_prefetch(std::vector<ParamGroup*> units) {
    forward_prefetch_ = std::move(units);
  }
  void set_backward_prefetch(std::vector<ParamGroup*> units) {
    backward_prefetch_ = std::move(units);
  }
  // How many units ahead the implicit prefetch gathers (0: off), for the whole tree. Throws on a
  // unit that is not its tree's root.
  void set_implicit_prefetch(int count);

  // FSDP2's gradient-accumulation controls, for this unit only (FSDPModule recurses). Throw if
  // a backward pass is running.
  void set_requires_gradient_sync(bool sync);
  void set_reshard_after_backward(bool reshard);
  void set_reshard_after_forward(bool reshard);
  // Custom collectives for this unit only (custom_collectives.cpp); null restores the process
  // group's own. Throw under a whole-tensor placement, or if a backward pass is running.
  void set_custom_all_gather(std::shared_ptr<AllGather> hook);
  void set_custom_reduce_scatter(std::shared_ptr<ReduceScatter> hook);
  // Whether the next backward is the last before the optimizer step, for the whole tree.
  // Throws on a unit that is not its tree's root, or if a backward pass is running.
  void set_is_last_backward(bool last);
  // FSDP2's reduction settings of this unit (see FSDPModule). Throw if a backward pass is
  // running, the factor also if it is not finite and > 0.
  void set_unshard_in_backward(bool unshard);
  void set_requires_all_reduce(bool all_reduce);
  void set_gradient_divide_factor(double factor);
  void set_force_sum_reduction_for_comms(bool enable);
  void set_all_reduce_hook(std::function<void(at::Tensor&)> hook);
  // See FSDPModule::set_observer.
  void set_observer(std::shared_ptr<RuntimeObserver> observer);
  const std::shared_ptr<RuntimeObserver>& observer() const { return options_.observer(); }
  // FullyShardOptions::ignored_params, which no enclosing unit may claim either.
  const std::vector<at::Tensor>& ignored_params() const { return options_.ignored_params(); }
  // The live unit that manages param (one of its parameters, by identity) and, in *index, the
  // parameter's position in its params(); nullptr if no unit manages it.
  static std::shared_ptr<ParamGroup> owner_of(const at::Tensor& param, size_t* index);
  // See GradientReducer::add_reduced_gradient: a gradient of params()[index] reduced outside
  // this unit's own collectives (a lookup from shards, sharded_lookup.h).
  void add_reduced_gradient(size_t index, at::Tensor addend);
  // The unit's label, mesh, streams and observer, for work done on its behalf outside its
  // hooks (a lookup from shards reports its waits to the observer as the unit's own).
  const UnitContext& context() const { return unit_; }
  // F, by which this unit's summed gradients are divided (GradientReducer::divide_factor).
  double gradient_divide_factor() const;
  // Every unit at or under this unit's module, in pre-order.
  std::vector<ParamGroup*> units_under() const;

  // Called by the root's RootState.
  // Joins tree (sharing its state from now on) as the unit at path under the root's module.
  void join_tree(std::shared_ptr<RootState> tree, const std::string& path, bool is_top);
  // Start of a step: reshards a unit that a forward left without a backward, forgets the
  // previous positions in the forward order.
  void reset_for_step();
  // The unit's first position in the previous step's forward order.
  void note_last_forward_index(int index) {
    if (last_forward_index_ < 0) last_forward_index_ = index;
  }
  // End of backward: reshards (or, with reshard_after_backward false, only completes a
  // prefetched all-gather) and goes idle.
  void finish_backward();
  // For error messages: the unit's path under the root, or the module's type name.
  const std::string& label() const { return label_; }
  // Path of the unit's module under the outermost fully_shard'ed module ("" for that one).
  const std::string& path() const { return path_; }
  void set_path(const std::string& path, bool is_top);
  torch::nn::Module& module() const { return *module_; }
  std::vector<FSDPParam>& params() { return params_; }
  const std::vector<FSDPParam>& params() const { return params_; }
  const DeviceMesh& mesh() const { return mesh_; }
  const at::Tensor& flat_shards() const { return flat_shards_; }
  bool is_unsharded() const { return sharded_state_ == ShardedState::kUnsharded; }
  bool gather_in_flight() const { return sharded_state_ == ShardedState::kGathering; }
  // Whether this unit is the root of the tree it joined (false before it joined one).
  bool is_root() const { return in_tree_ && &tree_->root() == this; }
  // Whether the sharded state lives in host memory while the mesh computes on a device.
  bool offloads_to_host() const { return offload_to_host_; }
  TrainingState training_state() const { return training_state_; }
  ShardedState sharded_state() const { return sharded_state_; }

 private:
  // The only writers of the two states: assert that from -> to is a legal transition (and that
  // the gather and hpZ piece agree with the new sharded state).
  void set_training_state(TrainingState to);
  void set_sharded_state(ShardedState to);

  // The tree's shared state (this unit's own until it joins a tree).
  RootState& tree() const { return *tree_; }
  // For the setters of tree-wide state: throws unless this unit is (or, before any tree was
  // made, can become) the root of its tree, naming the unit and the setter.
  void check_root_only(const char* setter) const;
  bool reshard_after_forward() const;
  void prefetch_forward();
  void prefetch_backward();

  // Unshard and reshard steps.
  void unshard_without_gather();
  // Frees the unsharded parameters (the state change is the caller's).
  void free_unsharded_params();
  // After forward, with reshard_after_forward = N (1 < N < W): keeps the piece of the unsharded
  // parameters that this rank serves within its post-forward group, then reshards.
  void reshard_to_post_forward_group();
  void drop_post_forward_piece();
  // set_unshard_in_backward(false): pre-backward without the gather. Throws if autograd saved a
  // parameter whose values were freed after forward.
  void skip_unshard_for_backward();

  // set_custom_*: throws under a whole-tensor placement, which has no collective to replace.
  void check_hooks_fit(const char* setting) const;
  void check_not_in_backward(const char* setting) const;
  // The same for a bool setter, named with its value ("setter(true)").
  void check_not_in_backward(const char* setter, bool value) const;

  torch::nn::Module* module_;  // not owned: the module owns this group
  std::string label_;
  std::string path_;
  std::vector<FSDPParam> params_;
  DeviceMesh mesh_;
  FullyShardOptions options_;
  at::ScalarType compute_dtype_;  // unsharded parameters and all-gathers
  bool reshard_after_backward_ = true;
  bool unshard_in_backward_ = true;
  at::Tensor flat_shards_;        // every parameter's padded shard, concatenated
  bool offload_to_host_ = false;  // flat_shards_ (and so gradients) on the host, mesh on a device
  // The phase ("fwd", "bwd") of the gather whose values the unsharded parameters hold; null
  // while sharded or unsharded without a gather (one rank). Names buffers for the recorded
  // schedule.
  const char* unsharded_phase_ = nullptr;
  // hpZ: the group of N ranks that gathers for backward (null unless reshard_after_forward
  // is an N with 1 < N < W), and in kPostForwardPiece this rank's piece of the unsharded
  // parameters: the W / N consecutive shards (in the all-gather's [W, S] layout) starting at
  // shard (rank in that group) * W / N, in the compute dtype.
  std::shared_ptr<ProcessGroup> post_forward_group_;
  at::Tensor post_forward_piece_;
  StreamEvent piece_ready_;  // recorded on compute once the piece is written

  TrainingState training_state_ = TrainingState::kIdle;
  ShardedState sharded_state_ = ShardedState::kSharded;
  std::unique_ptr<PendingGather> pending_gather_;  // set exactly in kGathering
  std::vector<ParamGroup*> forward_prefetch_;
  std::vector<ParamGroup*> backward_prefetch_;
  int forward_index_ = -1;       // position in this step's forward order
  int last_forward_index_ = -1;  // position in the previous step's forward order
  RuntimeObserver::Clock::time_point compute_begin_;

  bool is_top_ = true;    // no enclosing module is fully_shard'ed (set_path)
  bool in_tree_ = false;  // joined a tree (the root's lazy_init)
  // The tree's shared state, or this unit's own until it joins a tree.
  std::shared_ptr<RootState> tree_ =
      std::make_shared<RootState>(*this, mesh_.device(), observer_or_none(options_.observer()));
  UnitContext unit_{label_, mesh_, tree_->streams(), observer_or_none(options_.observer())};
  // The placement: the all-gather (or broadcasts) and copy-out (unsharder.h).
  std::unique_ptr<Unsharder> unsharder_;
  // Reduce-scatter, all-reduce, divide rules, accumulation and the reduce hooks.
  std::unique_ptr<GradientReducer> reducer_;
};

}  // namespace fsdp::detail
