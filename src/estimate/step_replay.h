// The one replay of an FSDP training step that both the memory estimator and the step-time
// planner use (src/estimate/memory_estimate.cpp walks it). The walk mirrors the runtime
// (src/runtime/param_group.cpp, root_state.cpp): which all-gathers are issued when (the unit's
// own, then the prefetched ones), where the compute thread waits for them, when each unit
// computes, when gradient reductions are issued and when they are completed (at most
// kMaxReductionsInFlight in flight, see [Note: why reductions are capped at two in flight] in
// fsdp/runtime/in_flight_limits.h; all at the end of a syncing backward). An observer sees these
// events in the order the rank's compute thread meets them; the memory accounting is one reader of
// the walk, the planner's timelines another, so the two can never disagree about the schedule.
#pragma once

#include <fsdp/memory_estimate.h>

#include <cstdint>
#include <vector>

namespace fsdp::detail {

// The root unit's index in the events below; the other units are 0 .. n-1 in forward order.
constexpr int kRootUnit = -1;

// Where the compute thread is in the step.
enum class ComputePhase {
  kRootStem,          // the root's forward before the first unit (embeddings)
  kForward,           // a unit's forward
  kRootHead,          // the root's forward after the last unit (final norm, output, loss)
  kRootHeadBackward,  // the backward of kRootHead, first in backward
  kBackward,          // a unit's backward (its recomputed forward too, under checkpointing)
  kRootStemBackward,  // the backward of kRootStem, last in backward
};

// Which collective reduces a unit's gradients.
enum class ReductionKind {
  kReduceScatter,  // over the shard group (then, under HSDP, an all-reduce across replicas)
  kAllReduce,      // over the replicas, in place (no_shard: one rank per shard group)
};

// The collectives of one pass of a lookup from shards ([Note: a lookup from shards] in
// src/runtime/sharded_lookup.cpp), forward's or backward's, on the mesh's side groups: the
// compute thread makes each and waits for it at once; they run on the side groups' own threads.
// Bytes as the process groups count a payload (an all-gather's output, a reduce-scatter's input).
struct LookupCollectives {
  enum class Group { kShard, kReplicate };
  struct Call {
    Group group;
    const char* name;  // "all_gather" or "reduce_scatter"
    int64_t bytes;
  };
  int shard_group = 1;      // ranks of the side shard group (as many as the shard group's)
  int replicas = 1;         // ranks of the side replicate group (HSDP's replicas)
  std::vector<Call> calls;  // in the order they are made
  // What the compute thread reads and writes beside them (the partial rows looked up from the
  // shard; the gathered gradients summed into the shard's rows).
  int64_t compute_bytes = 0;
};

class StepObserver {
 public:
  virtual ~StepObserver() = default;
  // A unit's all-gather is issued: output_bytes gathered over group_size ranks (a gather from
  // an hpZ piece runs within the post-forward group, on that group's own thread). cast_bytes:
  // the compute-dtype copy of the shards made first under mixed precision (0 otherwise).
  virtual void issue_gather(int unit, int64_t output_bytes, int group_size, bool from_piece,
                            int64_t cast_bytes) {}
  // The compute thread waits for the unit's all-gather, then copies unsharded_bytes out of it.
  virtual void wait_gather(int unit, int64_t unsharded_bytes) {}
  virtual void compute(int unit, ComputePhase phase) {}
  // A unit's gradients (full_bytes, in the compute dtype) are packed into input_bytes in the
  // reduce dtype and the reduction over group_size ranks is issued.
  virtual void issue_reduction(int unit, int64_t full_bytes, int64_t input_bytes,
                               ReductionKind kind, int group_size) {}
  // The compute thread waits for the oldest reduction; with replicas > 1 (HSDP) it then issues
  // the all-reduce of output_bytes across replicas ranks, which finish_all_reduce waits for
  // (see [Note: HSDP's all-reduce runs beside the next units' backward]); else it assigns the
  // gradients at once.
  virtual void finish_reduction(int unit, int64_t output_bytes, int replicas) {}
  // HSDP: the compute thread waits for the unit's all-reduce across replicas, then assigns the
  // output_bytes of gradients.
  virtual void finish_all_reduce(int unit, int64_t output_bytes) {}
  // The full gradients of a unit are kept (no sync) or assigned (one rank): a copy of bytes.
  virtual void keep_gradients(int unit, int64_t bytes) {}
  // A module's collectives over its tensor-parallel group in one pass (a unit's, or the root's
  // stem or head), after its compute: the compute thread makes and waits for each in turn.
  virtual void tensor_parallel(const TensorParallelBytes& traffic) {}
  // A lookup from shards' collectives in the root's stem (forward, then backward).
  virtual void lookup(const LookupCollectives& collectives) {}
  // AdamW over the rank's shards: shard_numel elements in the master dtype.
  virtual void optimizer_step(int64_t shard_numel) {}
};

// Replays one steady-state step, telling observer (optional) every event, and returns the
// memory estimate (estimate_memory is this with no observer).
MemoryEstimate replay_step(const ModelMemorySpec& model, const MemoryEstimateOptions& options,
                           StepObserver* observer);

}  // namespace fsdp::detail
