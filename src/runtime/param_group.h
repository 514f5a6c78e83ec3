// ParamGroup: the state of one FSDP unit (one fully_shard call), FSDP2's FSDPParamGroup plus,
// on the root unit, FSDP2's FSDPState bookkeeping for the whole tree.
//
// Lifecycle of a unit within one training step:
//   kIdle --pre_forward--> kForward --post_forward--> kForwardDone
//        --pre_backward (hook on an output's grad)--> kBackward
//        --post_backward (autograd node on the inputs, or the root's end-of-backward
//          callback for units whose node never ran)--> kIdle
// Parameters are unsharded from pre_forward to post_forward (and to the end of backward when
// reshard_after_forward is false) and from pre_backward to post_backward.
//
// Every collective a unit issues is issued by every rank in the same order, because every
// rank runs the same forward and the same autograd graph; units a rank's backward never
// reaches are finished, in reverse forward order, by the root's callback on every rank.
#pragma once

#include "runtime/fsdp_param.h"

#include <fsdp/device_mesh.h>
#include <fsdp/fully_shard.h>

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
  void post_forward(const std::vector<at::Tensor>& outputs);
  void abort_forward();
  void pre_backward();
  void post_backward();

  void unshard();
  void reshard();

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
  bool is_root() const { return root_ == this; }
  UnitState state() const { return state_; }

 private:
  void lazy_init_as_root();
  void begin_step();
  void queue_end_of_backward();
  void end_of_backward();
  bool reshard_after_forward() const;
  [[noreturn]] void rethrow_with_context(const char* what, const std::exception& e) const;

  torch::nn::Module* module_;  // not owned: the module owns this group
  std::string label_;
  std::string path_;
  std::vector<FSDPParam> params_;
  DeviceMesh mesh_;
  FullyShardOptions options_;
  at::Tensor flat_shards_;  // every parameter's padded shard, concatenated
  UnitState state_ = UnitState::kIdle;
  bool unsharded_ = false;

  ParamGroup* root_ = nullptr;
  // Root only.
  std::vector<ParamGroup*> units_;          // every unit under the root, pre-order
  std::vector<ParamGroup*> forward_order_;  // units in the order their forward ran this step
  bool end_of_backward_queued_ = false;
};

// The group attached to module by fully_shard, or nullptr.
ParamGroup* param_group_of(const torch::nn::Module& module);
// Attaches group to module (as a parameterless child module, so no global registry exists).
void attach_param_group(torch::nn::Module& module, std::shared_ptr<ParamGroup> group);

}  // namespace fsdp::detail
