// ParamGroup: the state of one FSDP unit (one fully_shard call), FSDP2's FSDPParamGroup plus,
// on the root unit, FSDP2's FSDPState bookkeeping for the whole tree.
//
// Lifecycle of a unit within one training step:
//   kIdle --pre_forward--> kForward --post_forward--> kForwardDone
//        --pre_backward (hook on an output's grad)--> kBackward
//        --post_backward (autograd node on the inputs, or the root's end-of-backward
//          callback for units whose node never ran)--> kIdle
// Parameters are unsharded from pre_forward to post_forward (and to the end of backward when
// reshard_after_forward is false) and from pre_backward to post_backward. With
// reshard_after_forward = N (hpZ), post_forward keeps this rank's 1/N piece of the unsharded
// parameters (post_forward_piece_) until pre_backward gathers from it within a group of N.
//
// Communication is asynchronous: an unshard is an all-gather issued on the process group's
// progress thread (issue_unshard) and completed, with the copy-out, only when the parameters
// are needed (wait_unshard). Prefetching issues the next unit's all-gather before the current
// unit computes: in forward, the next unit in the previous step's forward order; in backward,
// the unit before the current one in this step's forward order. A unit's reduce-scatter is
// issued in post_backward and completed later (when too many are in flight, or at the end of
// backward), so it overlaps the backward of the units before it.
//
// Every collective is issued by every rank in the same order, because every rank runs the same
// forward and the same autograd graph, and prefetch decisions depend only on that order. Units
// a rank's backward never reaches are finished, in reverse forward order, by the root's
// end-of-backward callback on every rank; gathers prefetched for units that never ran are
// completed and dropped there too.
#pragma once

#include "runtime/fsdp_param.h"

#include <fsdp/device_mesh.h>
#include <fsdp/fully_shard.h>

#include <deque>
#include <memory>
#include <string>
#include <vector>

namespace fsdp::detail {

enum class UnitState { kIdle, kForward, kForwardDone, kBackward };

class ParamGroup : public std::enable_shared_from_this<ParamGroup> {
 public:
  ParamGroup(torch::nn::Module* module, std::vector<FSDPParam> params, DeviceMesh mesh,
             FullyShardOptions options);

  // Hooks, called by ForwardScope and autograd.
  void pre_forward();
  // Casts outputs to the policy's output_dtype, hooks pre-backward onto them, reshards.
  void post_forward(std::vector<at::Tensor>& outputs);
  // Casts floating-point inputs to param_dtype when the policy asks for it.
  void cast_forward_inputs(std::vector<at::Tensor>& inputs) const;
  void abort_forward();
  void pre_backward();
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
  // How many units ahead the implicit prefetch gathers (0: off). Read from the root.
  void set_implicit_prefetch(int count);

  // FSDP2's gradient-accumulation controls, for this unit only (FSDPModule recurses). Throw if
  // a backward pass is running.
  void set_requires_gradient_sync(bool sync);
  void set_reshard_after_backward(bool reshard);
  void set_reshard_after_forward(bool reshard);
  // On the root: whether the next backward is the last before the optimizer step. If not, its
  // reduce-scatters may still be in flight when backward returns.
  void set_is_last_backward(bool last);
  // Every unit at or under this unit's module, in pre-order.
  std::vector<ParamGroup*> units_under() const;

  // For error messages: the unit's path under the root, or the module's type name.
  const std::string& label() const { return label_; }
  // Path of the unit's module under the outermost fully_shard'ed module ("" for that one).
  const std::string& path() const { return path_; }
  void set_path(std::string path, bool is_top);
  std::vector<FSDPParam>& params() { return params_; }
  const std::vector<FSDPParam>& params() const { return params_; }
  const DeviceMesh& mesh() const { return mesh_; }
  const at::Tensor& flat_shards() const { return flat_shards_; }
  bool is_unsharded() const { return unsharded_; }
  bool gather_in_flight() const { return pending_gather_ != nullptr; }
  bool is_root() const { return root_ == this; }
  UnitState state() const { return state_; }

 private:
  struct PendingGather {
    WorkHandle work;
    at::Tensor input;  // the shards cast to the compute dtype, or the hpZ piece; else undefined
    int64_t piece_bytes = 0;  // the hpZ piece's, counted as unsharded until the gather completes
    at::Tensor buffer;        // [W * shard numel]
    Tracer::Clock::time_point issued;
  };
  struct PendingReduce {
    ParamGroup* unit;
    WorkHandle work;
    at::Tensor input;   // [W * S]: kept alive until the op completes
    at::Tensor output;  // [S]: becomes the sharded gradients
    std::vector<FSDPParam*> params;
    std::vector<at::Tensor> previous;  // sharded gradients to add (accumulation)
    Tracer::Clock::time_point issued;
    const char* op = "reduce-scatter";  // what work is: a reduce-scatter, or (no shard
                                        // dimension) the all-reduce across replicas
    bool replicate_after = false;       // all-reduce output across replicas once work is done
  };

  void lazy_init_as_root();
  // After forward, with reshard_after_forward = N (1 < N < W): keeps the piece of the unsharded
  // parameters that this rank serves within its post-forward group, then reshards.
  void reshard_to_post_forward_group();
  void drop_post_forward_piece();
  // Takes a gather's buffer and hpZ piece off the books once they are released, and the unit's
  // count too unless the gather completed (gathered: the unit is now unsharded).
  void uncount_gather(const PendingGather& pending, bool gathered);
  void begin_step();
  void queue_end_of_backward();
  void end_of_backward();
  bool reshard_after_forward() const;
  int implicit_prefetch() const;
  void prefetch_forward();
  void prefetch_backward();
  // Completes the root's oldest in-flight reduce-scatters until at most keep remain.
  void finish_reduces(size_t keep);
  static void finish_reduce(PendingReduce& reduce);
  // Blocks on work, counting the wait as exposed communication; rethrows with context.
  void wait_for(const WorkHandle& work, const char* what);
  void check_not_in_backward(const char* setting) const;
  [[noreturn]] void rethrow_with_context(const char* what, const std::exception& e) const;

  torch::nn::Module* module_;  // not owned: the module owns this group
  std::string label_;
  std::string path_;
  std::vector<FSDPParam> params_;
  DeviceMesh mesh_;
  FullyShardOptions options_;
  at::ScalarType compute_dtype_;  // unsharded parameters and all-gathers
  at::ScalarType reduce_dtype_;   // gradient reduction
  bool requires_gradient_sync_ = true;
  bool reshard_after_backward_ = true;
  at::Tensor flat_shards_;  // every parameter's padded shard, concatenated
  // hpZ: the group of N ranks that gathers for backward (null unless reshard_after_forward
  // is an N with 1 < N < W), and between forward and backward this rank's piece of the
  // unsharded parameters: the W / N consecutive shards (in the all-gather's [W, S] layout)
  // starting at shard (rank in that group) * W / N, in the compute dtype.
  std::shared_ptr<ProcessGroup> post_forward_group_;
  at::Tensor post_forward_piece_;
  UnitState state_ = UnitState::kIdle;
  bool unsharded_ = false;
  std::unique_ptr<PendingGather> pending_gather_;
  std::vector<ParamGroup*> forward_prefetch_;
  std::vector<ParamGroup*> backward_prefetch_;
  int forward_index_ = -1;       // position in this step's forward order
  int last_forward_index_ = -1;  // position in the previous step's forward order
  Tracer::Clock::time_point compute_begin_;

  ParamGroup* root_ = nullptr;
  // Root only.
  int implicit_prefetch_ = 1;
  bool is_last_backward_ = true;
  std::vector<ParamGroup*> units_;               // every unit under the root, pre-order
  std::vector<ParamGroup*> forward_order_;       // units in the order their forward ran this step
  std::vector<ParamGroup*> last_forward_order_;  // the same, for the previous step
  std::deque<PendingReduce> pending_reduces_;
  bool end_of_backward_queued_ = false;
};

// The group attached to module by fully_shard, or nullptr.
ParamGroup* param_group_of(const torch::nn::Module& module);
// Attaches group to module (as a parameterless child module, so no global registry exists).
void attach_param_group(torch::nn::Module& module, std::shared_ptr<ParamGroup> group);

}  // namespace fsdp::detail
