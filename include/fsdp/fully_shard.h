// fully_shard: FSDP2's per-parameter sharding for torch::nn modules.
//
// After fully_shard(module, mesh), every parameter of module that no already-sharded
// descendant owns is sharded along dim 0 across the mesh (or the dim shard_placement_fn picks):
// each rank keeps ceil(size / W) slices along it (zero-padded on the last ranks) and
// module->parameters() return exactly those local shards,
// so any torch::optim optimizer built on them works unchanged and holds 1/W of the state.
//
// C++ modules have no forward hooks, so the one change a model needs is at the call site of
// each sharded module: call it through fsdp::forward(module, args...) instead of
// module->forward(args...). For a module that is not sharded, fsdp::forward is a plain call.
//
//   for (auto& block : blocks_) x = fsdp::forward(block, x);   // was: x = block->forward(x);
//
// Around each call the runtime all-gathers the unit's parameters, runs forward, reshards
// (if reshard_after_forward), and registers autograd hooks that gather again before the
// unit's backward and reduce-scatter (average) its gradients after it.
#pragma once

#include <fsdp/comm/comm_hooks.h>
#include <fsdp/device_mesh.h>
#include <fsdp/runtime/forward.h>
#include <fsdp/runtime/observer.h>

#include <c10/util/ArrayRef.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fsdp {

class WholeTensorPlacement;  // fsdp/runtime/whole_tensor.h

// FSDP2's MixedPrecisionPolicy. The sharded parameters (what the optimizer updates) and the
// optimizer state keep their own dtype (fp32 master weights); only the unsharded copies used
// by forward and backward, and the communication, change dtype.
struct MixedPrecisionPolicy {
  // dtype of the unsharded parameters, and so of the all-gather and of forward/backward
  // compute. (optional) defaults to the parameters' own dtype.
  TORCH_ARG(std::optional<at::ScalarType>, param_dtype) = std::nullopt;
  // dtype in which gradients are reduce-scattered (and all-reduced across replicas).
  // (optional) defaults to param_dtype.
  TORCH_ARG(std::optional<at::ScalarType>, reduce_dtype) = std::nullopt;
  // dtype the unit's floating-point outputs are cast to. (optional) defaults to no cast.
  TORCH_ARG(std::optional<at::ScalarType>, output_dtype) = std::nullopt;
  // Cast the unit's floating-point tensor inputs to param_dtype. (optional) defaults to true.
  TORCH_ARG(bool, cast_forward_inputs) = true;
  // dtype the unit's floating-point buffers (those at or under its module and not under a
  // nested unit) are cast to, in place, when fully_shard is applied; they keep it from then on.
  // Buffers are not sharded. FSDP1's MixedPrecision.buffer_dtype (FSDP2 has none; FSDP1 casts
  // at the first forward). (optional) defaults to the buffers' own dtypes.
  TORCH_ARG(std::optional<at::ScalarType>, buffer_dtype) = std::nullopt;
};

// FSDP2's reshard_after_forward, which is a bool or an int:
//   true   free the unsharded parameters after the unit's forward; its backward all-gathers
//          them again over the whole shard group (ZeRO-3).
//   false  keep them from forward to backward: no second all-gather, more memory (ZeRO-2).
//   int N  ZeRO++'s hpZ: after forward keep a 1/N piece of the unsharded parameters, so the
//          backward all-gather runs within a group of N consecutive ranks of the shard group
//          (say, one node) instead of across all W. N must divide W; N = W is true, N = 1 is
//          false.
class ReshardAfterForward {
 public:
  ReshardAfterForward(bool reshard)  // NOLINT(google-explicit-constructor): like FSDP2's bool
      : whole_group_(reshard) {}
  ReshardAfterForward(int group_size)  // NOLINT(google-explicit-constructor): and its int
      : group_size_(group_size) {}
  // The size of the group the parameters are resharded to after forward, for a shard group of
  // shard_size ranks: shard_size for true, 1 for false, N for N.
  int group_size(int shard_size) const { return whole_group_ ? shard_size : group_size_; }
  // Whether the gathered parameters are freed after forward (true, or N > 1). true frees them
  // even with one rank, where that drops only a mixed-precision copy.
  bool frees_after_forward() const { return whole_group_ || group_size_ > 1; }

 private:
  bool whole_group_ = false;
  int group_size_ = 1;
};

// FSDP2's CPUOffloadPolicy: a unit's sharded parameters, their gradients and so the optimizer
// state live in host memory. Each all-gather first copies the unit's shards to the mesh's device
// (on the all-gather copy-in stream), each reduce-scattered gradient is copied back to the host,
// and the optimizer steps there on host tensors. The host waits for those copies at the end of
// backward. On a CPU mesh the state is on the host already and nothing is copied.
struct CPUOffloadPolicy {
  // Page-locked host memory, so the copies to and from the device run asynchronously. Needs a
  // device with streams; on a CPU mesh there is nothing to copy, and true is accepted and ignored
  // with a warning that says so. (optional) defaults to true.
  TORCH_ARG(bool, pin_memory) = true;
};

// FSDP2's shard_placement_fn: given a parameter's name (relative to the module passed to
// fully_shard) and its full value, the dim d it is sharded along, Shard(d), or nullopt for
// Shard(0). A negative d counts from the end (-1: the last dim); d outside [-ndim, ndim) is
// refused. Unlike FSDP2, a size along d that W does not divide is accepted and padded, as
// Shard(0) is.
using ShardPlacementFn =
    std::function<std::optional<int64_t>(const std::string& name, const at::Tensor& param)>;

struct FullyShardOptions {
  // What happens to the unsharded parameters after this unit's forward (see
  // ReshardAfterForward). (optional) defaults to true for every unit but the root, false for
  // the root, whose backward starts right after its forward.
  TORCH_ARG(std::optional<ReshardAfterForward>, reshard_after_forward) = std::nullopt;
  TORCH_ARG(MixedPrecisionPolicy, mp_policy) = MixedPrecisionPolicy();
  // Keep the sharded state in host memory (see CPUOffloadPolicy). (optional) defaults to none:
  // the state lives on the mesh's device.
  TORCH_ARG(std::optional<CPUOffloadPolicy>, offload_policy) = std::nullopt;
  // Inter-tensor ZeRO-3 (fsdp/runtime/whole_tensor.h): each parameter lives whole on the rank
  // the placement names, and is broadcast from it and its gradient reduced to it, instead of
  // Shard(0). Every parameter of the unit needs an owner in [0, W); the mesh must be 1-D and
  // reshard_after_forward a bool. (optional) defaults to none: Shard(0).
  TORCH_ARG(std::shared_ptr<const WholeTensorPlacement>, whole_tensor) = nullptr;
  // Per-parameter Shard(dim) placement (see ShardPlacementFn); not combinable with whole_tensor,
  // whose tensors are not split. (optional) defaults to none: Shard(0) for every parameter.
  TORCH_ARG(ShardPlacementFn, shard_placement_fn) = nullptr;
  // FSDP2's ignored_params: parameters registered at or under the module that this unit (and any
  // enclosing unit) leaves alone. They are not sharded, not gathered and their gradients are
  // not reduced: each rank keeps the full tensor it had and the gradient its own backward
  // computed (synchronizing them, if wanted, is the caller's business). Checkpoints and export
  // save them as full tensors (rank 0's value); clip_grad_norm_ refuses them (their gradients
  // differ per rank, so no global norm exists). Every tensor must be a parameter of the module;
  // fully_shard throws naming one that is not. (optional) defaults to none.
  TORCH_ARG(std::vector<at::Tensor>, ignored_params) = {};
  // Where this unit reports the bytes it holds, the time compute waits on its collectives and
  // its timeline spans (fsdp/runtime/observer.h; a RankMonitor keeps counts and a timeline).
  // Give every unit of a tree the same one. (optional) defaults to none: nothing is reported.
  TORCH_ARG(std::shared_ptr<RuntimeObserver>, observer) = nullptr;
};

// Where a rank's shard of one parameter sits in the global tensor (DTensor-like metadata).
// Under Shard(d) the "rows" are the slices along d: slices [local_offset, local_offset +
// local_rows) of the global tensor along d live on this rank, followed along d by
// padded_rows - local_rows slices of zero padding; the local shard's shape is the global shape
// with d's size replaced by padded_rows. A 0-D parameter is treated as a 1-element vector.
// Under a whole-tensor placement (always d = 0) padded_rows = local_rows = the global rows on
// the owner and 0 on every other rank.
struct ShardMetadata {
  std::vector<int64_t> global_shape;
  int64_t shard_dim = 0;     // d, in [0, ndim) (0 for a 0-D parameter)
  int64_t local_offset = 0;  // first global slice along shard_dim held by this rank
  int64_t local_rows = 0;    // real slices along shard_dim held by this rank (may be 0)
  int64_t padded_rows = 0;   // slices of the local shard along shard_dim, padding included
  int mesh_rank = 0;
  int mesh_size = 1;
  std::string placement() const { return "Shard(" + std::to_string(shard_dim) + ")"; }
};

struct ShardedParameter {
  std::string name;  // relative to the sharded module
  at::Tensor local;  // the parameter itself: its data is the padded local shard
  ShardMetadata metadata;
};

namespace detail {
class ParamGroup;
}

// Handle on an unshard issued with async_op: wait() completes it. Waiting twice is harmless.
class UnshardHandle {
 public:
  void wait();

 private:
  friend class FSDPModule;
  explicit UnshardHandle(std::shared_ptr<detail::ParamGroup> group) : group_(std::move(group)) {}

  std::shared_ptr<detail::ParamGroup> group_;
};

// Handle on a sharded module (FSDP2's FSDPModule methods). Cheap to copy. Obtained from
// fully_shard, fsdp_module_of or fsdp_modules_under.
class FSDPModule {
 public:
  // Path of this unit's module under the outermost sharded module, "" for that module itself
  // (so a parameter's full name is path + "." + its name, or its name alone).
  const std::string& path() const;

  // Parameters this unit manages, with their shard metadata, in registration order.
  std::vector<ShardedParameter> sharded_parameters() const;
  // Bytes of this unit's local shards (padding included).
  int64_t sharded_param_bytes() const;

  // Gathers the full parameters. With async_op the all-gather is only issued and the returned
  // handle's wait() completes it (and is needed before the parameters are used); otherwise it
  // has completed on return. FSDP2's FSDPModule.unshard(async_op).
  UnshardHandle unshard(bool async_op = false);
  // Frees the full parameters now (completing an all-gather still in flight).
  void reshard();
  // Whether the full parameters are materialized, and whether an all-gather is in flight.
  bool is_unsharded() const;
  bool gather_in_flight() const;

  // Explicit prefetching (FSDP2's names): before this unit's forward (backward) computes, issue
  // the all-gathers of these units, replacing the implicit choice for this unit.
  void set_modules_to_forward_prefetch(const std::vector<FSDPModule>& modules);
  void set_modules_to_backward_prefetch(const std::vector<FSDPModule>& modules);
  // Implicit prefetching, set on the root for its whole tree: how many units ahead to gather,
  // in forward (next in the previous step's forward order) and in backward (next in reverse
  // forward order). 0 turns prefetching off; (optional) defaults to 1.
  void set_implicit_prefetch(int units);

  // Gradient accumulation (FSDP2's names; recurse: also every unit under this module). All
  // throw if called while a backward pass is running.
  // sync=false: backward keeps full gradients locally (summed over backward passes) and
  // reduce-scatters nothing; the next backward with sync=true reduces the sum.
  void set_requires_gradient_sync(bool sync, bool recurse = true);
  // false: parameters stay unsharded after backward, so the next forward gathers nothing.
  void set_reshard_after_backward(bool reshard, bool recurse = true);
  void set_reshard_after_forward(bool reshard, bool recurse = true);
  // On the root: false lets the next backward return with reduce-scatters in flight (they
  // complete in a later backward); true (the default) completes them before it returns.
  void set_is_last_backward(bool last);

  // Custom collectives (FSDP2's names and scope: this unit only, not the units under it; call
  // it on each unit, e.g. over fsdp_modules_under). The all-gather hook replaces every gather of
  // this unit's parameters: over the shard group, and under hpZ (reshard_after_forward = N) the
  // backward gather within the post-forward group of N ranks, whose input is this rank's piece.
  // The reduce-scatter hook replaces the gradient reduce-scatter over the shard group; under
  // HSDP the all-reduce across replicas that follows stays the runtime's, and with a shard
  // group of one rank there is no reduce-scatter to replace. Hooks only see units that gather:
  // with one rank and no cast nothing is called. nullptr restores the default. Both throw for a
  // whole_tensor unit (it broadcasts and reduces instead) and while a backward pass is running.
  // Ready-made: Int8AllGather (comm_hooks.h), ZeRO++'s quantized weight gather.
  void set_custom_all_gather(std::shared_ptr<AllGather> hook);
  void set_custom_reduce_scatter(std::shared_ptr<ReduceScatter> hook);
  // Whether this unit gathers its parameters before its backward (FSDP2's
  // set_unshard_in_backward; this unit only). false is for units whose backward does not read
  // their parameters, such as an embedding: the all-gather before backward is skipped, and the
  // gradients are still reduce-scattered. If the parameters were freed after forward
  // (reshard_after_forward) and autograd saved them for backward, the unit's pre-backward
  // throws naming the parameter, instead of backward reading freed memory. (optional) defaults
  // to true. Throws during a backward pass.
  void set_unshard_in_backward(bool unshard);
  // HSDP (2-D mesh): whether backward all-reduces the reduce-scattered gradients across
  // replicas (FSDP2's set_requires_all_reduce; recurse: also every unit under this module).
  // false still reduce-scatters every backward but keeps the result in a sharded buffer of
  // this unit (the parameters get no gradient from it yet); the next backward with true adds it
  // to its own reduce-scattered gradients and all-reduces the sum. Gradient accumulation that
  // talks only within the shard group until the last micro-batch. No effect on a 1-D mesh, as
  // in FSDP2. (optional) defaults to true. Throws during a backward pass.
  void set_requires_all_reduce(bool all_reduce, bool recurse = true);
  // FSDP2's set_gradient_divide_factor (this unit only): the sharded gradient is the sum of
  // the data-parallel ranks' gradients divided by factor, instead of their mean (factor =
  // shard size x replicate size). Where the division happens follows FSDP2's rules, see
  // src/runtime/gradient_reduction.h. factor must be finite and > 0. Throws during a backward
  // pass.
  void set_gradient_divide_factor(double factor);
  // FSDP2's set_force_sum_reduction_for_comms (this unit only): every gradient collective sums
  // (ReduceOp::kSum) and the division is a separate scaling of the input or output, instead
  // of the collectives averaging. (optional) defaults to false. Throws during a backward pass.
  void set_force_sum_reduction_for_comms(bool enable);
  // FSDP2's set_all_reduce_hook (this unit only): hook(reduced) runs on every rank after the
  // gradient reduction, before the sharded gradients are assigned: on a 1-D mesh with the
  // reduce-scatter's output, on a 2-D mesh with the output of the all-reduce across replicas.
  // It may modify the tensor in place (its shape and dtype must stay): for example all-reduce
  // it over a group of its own. The tensor holds the unit's padded shards of every trainable
  // parameter, in registration order, in the reduce dtype, before any post-divide (with
  // force-sum on, a hook that reduces must sum, as FSDP then divides by the whole factor).
  // FSDP2 takes an optional CUDA stream to run the hook on; here the hook runs on the host
  // thread after the reduction has completed (on a device, after the host waited for it), so
  // there is no stream to choose. An empty function removes the hook. Throws during a
  // backward pass.
  void set_all_reduce_hook(std::function<void(at::Tensor&)> hook);

  // Where this unit reports from now on (FullyShardOptions::observer; null: nowhere); on the
  // root, the tree's stream ops too (RuntimeObserver::stream_op). Throws during a step, or
  // while the unit holds unsharded parameters or unsynced gradients (their bytes are on the old
  // observer's books).
  void set_observer(std::shared_ptr<RuntimeObserver> observer);
  const std::shared_ptr<RuntimeObserver>& observer() const;

 private:
  friend FSDPModule fully_shard(const std::shared_ptr<torch::nn::Module>& module,
                                const DeviceMesh& mesh, const FullyShardOptions& options);
  friend std::optional<FSDPModule> fsdp_module_of(const torch::nn::Module& module);
  explicit FSDPModule(std::shared_ptr<detail::ParamGroup> group) : group_(std::move(group)) {}
  static std::vector<detail::ParamGroup*> groups_of(const std::vector<FSDPModule>& modules);

  std::shared_ptr<detail::ParamGroup> group_;
};

// Shards module's parameters (those not owned by an already sharded descendant) over mesh.
// Call it bottom-up: blocks first, then the root. Throws if module is already sharded, or if
// a parameter is not on the mesh's device.
FSDPModule fully_shard(const std::shared_ptr<torch::nn::Module>& module, const DeviceMesh& mesh,
                       const FullyShardOptions& options = {});
template <typename ModuleType>
FSDPModule fully_shard(const torch::nn::ModuleHolder<ModuleType>& module, const DeviceMesh& mesh,
                       const FullyShardOptions& options = {}) {
  return fully_shard(std::static_pointer_cast<torch::nn::Module>(module.ptr()), mesh, options);
}

// The FSDPModule of a sharded module, or nullopt.
std::optional<FSDPModule> fsdp_module_of(const torch::nn::Module& module);

// Every FSDP unit at or under module, in pre-order.
std::vector<FSDPModule> fsdp_modules_under(const torch::nn::Module& module);

// The distinct parameters of module (a tied parameter listed once, at its first name), in
// named_parameters() order. LibTorch's parameters() lists a tied tensor once per module that
// registers it, which would make an optimizer step it twice.
std::vector<at::Tensor> unique_parameters(const torch::nn::Module& module);
std::vector<std::pair<std::string, at::Tensor>> unique_named_parameters(
    const torch::nn::Module& module);

}  // namespace fsdp
