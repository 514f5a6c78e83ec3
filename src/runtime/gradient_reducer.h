// GradientReducer: how one FSDP unit turns the full gradients of a backward into the sharded
// gradients the optimizer sees (FSDP2's foreach_reduce and the reduction settings of
// FSDPParamGroup). The unit's state machine (ParamGroup) decides when; the reducer decides how:
//   - accumulation: a sharded gradient left from an earlier backward is stashed before backward
//     (AccumulateGrad would add a full gradient to it) and added back after; with
//     set_requires_gradient_sync(false) the full gradients are kept, summed, for the backward
//     that syncs; with set_requires_all_reduce(false) (HSDP) the reduce-scattered ones are kept,
//     summed, for the backward that all-reduces;
//   - the collectives: the gradients are packed into one [W, S] buffer (S: the unit's padded
//     shard numel over trainable parameters) and reduce-scattered over the shard group, then,
//     HSDP, all-reduced across replicas; with no shard dimension (DDP-style) all-reduced in
//     place; under a whole-tensor placement reduced to each tensor's owner; with one rank, kept;
//   - the divide rules (gradient_reduction.h: FSDP2's pre- and post-divide factors) and the
//     hooks: a custom reduce-scatter (custom_collectives.h) and the all-reduce hook.
// A reduction is issued by reduce() and handed to the tree (RootState), which completes it
// with finish(), oldest first (see [Note: why reductions are capped at two in flight]); under
// HSDP the tree first starts its all-reduce across replicas with start_all_reduce() and
// finishes it later (see [Note: HSDP's all-reduce runs beside the next units' backward]).
#pragma once

#include "runtime/device_streams.h"
#include "runtime/fsdp_param.h"
#include "runtime/gradient_reduction.h"
#include "runtime/owner_buckets.h"
#include "runtime/unit_context.h"

#include <fsdp/comm/comm_hooks.h>
#include <fsdp/comm/process_group.h>
#include <fsdp/util/trace.h>

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

namespace fsdp::detail {

class GradientReducer;

// A unit's gradient reduction in flight: a reduce-scatter over the shard group, an all-reduce
// across replicas (no shard dimension), or the reduces to each owner (whole-tensor).
struct PendingReduce {
  GradientReducer* reducer = nullptr;  // the unit's, which finishes it
  WorkHandle work;
  StreamEvent packed;   // recorded on compute after the gradients were packed into input
  StreamEvent reduced;  // recorded on the reduce-scatter stream after the collective
  at::Tensor input;     // [W * S]: kept alive until the op completes
  at::Tensor output;    // [S]: becomes the sharded gradients
  std::vector<FSDPParam*> params;
  std::vector<at::Tensor> previous;  // sharded gradients to add (accumulation)
  RuntimeObserver::Clock::time_point issued;
  const char* op = "reduce-scatter";  // what work is, for the trace
  bool replicate_after = false;       // HSDP: all-reduce output across replicas once work is done
  ReduceOp all_reduce_op = ReduceOp::kSum;  // ... with this op
  // ... and, once start_all_reduce() issued it: that all-reduce, the event recorded after it,
  // and when it was issued.
  WorkHandle across;
  StreamEvent all_reduced;
  RuntimeObserver::Clock::time_point across_issued;
  // HSDP with set_requires_all_reduce(false): add output to the unit's partial sum instead of
  // all-reducing it and assigning gradients.
  bool keep_partial = false;
  double post_divide = 1.0;  // divides the output before it becomes the sharded gradients
};

// What a backward left on a unit's trainable parameters: each one's full gradient of this
// backward (undefined if it got none) and the sharded gradient it held before (undefined after
// zero_grad).
struct UnitGrads {
  std::vector<FSDPParam*> params;
  std::vector<at::Tensor> full;
  std::vector<at::Tensor> previous;
  int64_t reduce_numel = 0;  // S: the padded shard numel over params
  int64_t full_bytes = 0;
};

class GradientReducer {
 public:
  // unit, params and flat_shards (every parameter's padded shard, in the master dtype, on the
  // host with offload) are the unit's own and outlive the reducer. owner_buckets is empty
  // unless the unit has a whole-tensor placement over several ranks.
  GradientReducer(const UnitContext& unit, std::vector<FSDPParam>& params,
                  const at::Tensor& flat_shards, at::ScalarType reduce_dtype, bool offload_to_host,
                  std::vector<OwnerBucket> owner_buckets);
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // FSDP2's settings (see FSDPModule); the unit checks that no backward is running.
  void set_requires_gradient_sync(bool sync) { requires_gradient_sync_ = sync; }
  void set_requires_all_reduce(bool all_reduce) { requires_all_reduce_ = all_reduce; }
  // Throws unless factor is finite and > 0.
  void set_gradient_divide_factor(double factor);
  void set_force_sum_reduction_for_comms(bool enable) { force_sum_reduction_ = enable; }
  void set_all_reduce_hook(std::function<void(at::Tensor&)> hook) {
    all_reduce_hook_ = std::move(hook);
  }
  void set_reduce_scatter_hook(std::shared_ptr<ReduceScatter> hook) {
    reduce_scatter_hook_ = std::move(hook);
  }

  // F: the sharded gradient is the sum of the data-parallel ranks' gradients divided by it
  // (gradient_reduction.h): the divide factor if set, else shard size x replicate size.
  double divide_factor() const;
  // A sharded gradient for p (one of this unit's) already reduced over every data-parallel
  // rank and divided by divide_factor(), in the master dtype: added to p's sharded gradient
  // when this unit next assigns them, or at once if backward_done (the unit's backward of this
  // step is over or never comes) and nothing is in flight or kept. See [Note: a lookup's
  // gradient joins the unit's].
  void add_reduced_gradient(FSDPParam& p, at::Tensor addend, bool backward_done);

  // Whether this backward's gradients go to a collective (not kept unsynced, not one rank's).
  bool reduces_gradients() const;
  // Whether it holds counted bytes between steps: unsynced full gradients or a partial sum.
  bool holds_bytes() const;
  // Pre-backward: moves each trainable parameter's sharded gradient aside.
  void stash_sharded_grads();
  // Post-backward, before the unit reshards: takes this backward's full gradients (none if
  // pre-backward never ran) and the stashed ones off the parameters.
  UnitGrads take_grads(bool backward_ran);
  // Post-backward, after the unit resharded: reduces grads, or keeps them (no sync, one rank,
  // HSDP without the all-reduce). Returns the reduction in flight, if one was issued.
  std::optional<PendingReduce> reduce(UnitGrads grads);
  // Completes a reduction reduce() issued and hands each parameter its sharded gradient. A
  // reduction with replicate_after must have had start_all_reduce() first.
  void finish(PendingReduce& reduce);
  // HSDP: completes the reduce-scatter and issues the all-reduce of its output across replicas,
  // without waiting for it; finish() waits for it later.
  void start_all_reduce(PendingReduce& reduce);

 private:
  // The scaling and ops of this unit's next reduction (gradient_reduction.h).
  GradientReduction plan() const;
  void add_unsynced_grads(UnitGrads& grads);
  void keep_unsynced_grads(UnitGrads& grads);
  void assign_single_rank_grads(UnitGrads& grads);
  // With replicas only and no all-reduce: the packed gradients join the partial sum.
  void keep_local_partial(UnitGrads& grads);
  at::Tensor pack_input(UnitGrads& grads, StreamEvent& packed);
  PendingReduce issue_reduce(UnitGrads grads);
  // The collective of issue_reduce: an all-reduce of the packed input across replicas (no shard
  // dimension), else a reduce-scatter over the shard group.
  void issue_all_reduce_in_place(PendingReduce& reduce, const GradientReduction& plan);
  void issue_reduce_scatter(PendingReduce& reduce, const GradientReduction& plan,
                            int64_t reduce_numel);
  // Whole-tensor: packs the full gradients by owner and reduces each bucket to its owner; the
  // output is this rank's own bucket, which becomes its owned parameters' gradients.
  PendingReduce issue_owner_reduces(UnitGrads grads);
  // Allocates reduce's input (the other owners' buckets, back to back) and output (this rank's
  // own bucket) and packs the full gradients into them; returns each owner's numel.
  std::map<int, int64_t> pack_by_owner(UnitGrads& grads, PendingReduce& reduce);
  // The first part of every finish: waits (in program order) for the reduction's collective,
  // reports it, and takes its input off the books.
  void complete_collective(PendingReduce& reduce);
  // HSDP: issues the all-reduce of reduce.output (plus the partial sum, if any) across replicas
  // once reduce.reduced is recorded, into reduce.across and reduce.all_reduced.
  void issue_all_reduce_across_replicas(PendingReduce& reduce);
  // Assigns the reduced output once ready is recorded and lets go of the runtime's reference.
  void assign_and_release(PendingReduce& reduce, const StreamEvent& ready);
  // Adds a reduced output to partial_reduce_output_ and gives the parameters back the sharded
  // gradients they had.
  void keep_partial_reduce(const at::Tensor& reduced, const PendingReduce& reduce);
  // Takes the partial sum off the books and adds it into output (if there is one).
  void add_partial_sum(const at::Tensor& output);
  // Runs the all-reduce hook on the reduced gradients, checking it kept their shape and dtype.
  void run_all_reduce_hook(at::Tensor& reduced) const;
  // Divides, hooks and converts the reduced output to the master dtype (on the host with
  // offload) and assigns it, on compute.
  StreamEvent assign_reduced(PendingReduce& reduce, const StreamEvent& ready);
  static void assign_sharded_grads(const at::Tensor& reduced, const PendingReduce& reduce);

  const UnitContext& unit_;
  std::vector<FSDPParam>& params_;
  const at::Tensor& flat_shards_;
  at::ScalarType reduce_dtype_;
  bool offload_to_host_;
  std::vector<OwnerBucket> owner_buckets_;  // empty unless whole-tensor with W > 1
  bool requires_gradient_sync_ = true;
  bool requires_all_reduce_ = true;
  std::optional<double> gradient_divide_factor_;
  bool force_sum_reduction_ = false;
  std::function<void(at::Tensor&)> all_reduce_hook_;
  std::shared_ptr<ReduceScatter> reduce_scatter_hook_;  // null: the process group's own
  // HSDP: reduce-scattered gradients of backward passes that did not all-reduce, summed, in the
  // reduce dtype (undefined when there are none); added in by the next one that does.
  at::Tensor partial_reduce_output_;
  // Reductions reduce() issued that finish() has not yet completed.
  int reductions_in_flight_ = 0;
};

}  // namespace fsdp::detail
