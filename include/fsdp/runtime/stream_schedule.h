// The CUDA stream and event schedule of one training step, as data (issue 14, item 3).
//
// Nothing here touches CUDA: it describes which stream each operation runs on, which events it
// waits on and records, which buffers it reads and writes, and which buffers it frees, so that
// the invariants can be checked on a machine with no GPU. On a GPU the runtime has issued it on
// one H200 (bench/RESULTS.md, "First contact with a GPU"); no recorded GPU step was compared.
// The runtime issues the same ops through src/runtime/device_streams.h and reports them to a
// RuntimeObserver::stream_op (observer.h), so a recorded step can be compared with the built one
// and checked by the same checker.
//
// The model is N sequential units (blocks), the steady state of a step (the runtime's implicit
// forward prefetch follows the previous step's order, so step 1 prefetches nothing in forward),
// with no enclosing root unit. Frees follow FSDP2 without record_stream: a buffer is freed on the
// stream that allocated it (its first writer's), after that stream has waited on the event of
// its last reader; frees that cannot be ordered yet are deferred to the next op on that stream.
#pragma once

#include <fsdp/runtime/in_flight_limits.h>

#include <string>
#include <vector>

namespace fsdp {

enum class ScheduleStream { kCompute, kCopyIn, kAllGather, kReduceScatter, kAllReduce };
inline constexpr int kScheduleStreams = 5;

enum class ScheduleOpKind {
  kCopyIn,         // allocates the all-gather buffer; casts or copies shards in (copy-in stream)
  kAllGather,      // shards (or their copy) -> all-gather buffer (all-gather stream)
  kCopyOut,        // all-gather buffer -> unsharded parameters (compute stream)
  kForward,        // reads the unsharded parameters (compute)
  kReshard,        // frees the unsharded parameters (compute)
  kBackward,       // reads the unsharded parameters, writes the unsharded gradient (compute)
  kRsCopyIn,       // unsharded gradient -> reduce-scatter input (compute, as FSDP2: frees it)
  kReduceScatter,  // input -> reduce-scatter output (reduce-scatter stream)
  kAllReduce,      // HSDP: across replicas, in place in the output (all-reduce stream)
  kFinishReduce,   // output -> sharded gradient; the runtime's lazy finish_reduce (compute)
  kRelease,        // frees deferred until their last reader's event could be waited on
  kBeginStep,      // marks the step's start on compute (after the optimizer wrote the shards)
};

struct ScheduleOp {
  ScheduleStream stream = ScheduleStream::kCompute;
  ScheduleOpKind kind = ScheduleOpKind::kForward;
  int unit = -1;                    // -1 for a release that serves several units
  std::vector<std::string> waits;   // events this stream waits on before the op
  std::vector<std::string> reads;   // buffer names
  std::vector<std::string> writes;  // buffer names (allocated by the first writer)
  std::string record;               // event recorded after the op; empty for none
  std::vector<std::string> frees;   // buffers freed after the op, on this stream
};

struct ScheduleOptions {
  int units = 1;  // >= 1
  // Implicit prefetch depth; 0 = off. The runtime's default (see
  // [Note: why implicit prefetch gathers one unit ahead]).
  int prefetch = kDefaultPrefetchDepth;
  bool reshard_after_forward = true;
  bool hsdp = false;  // all-reduce across replicas after each reduce-scatter
  // The runtime's cap (see [Note: why reductions are capped at two in flight]); other values
  // exist for tests.
  int reduces_in_flight = kMaxReductionsInFlight;
  // HSDP's all-reduces (see [Note: HSDP's all-reduce runs beside the next units' backward]).
  int all_reduces_in_flight = kMaxAllReducesInFlight;
};

struct StreamSchedule {
  ScheduleOptions options;
  std::vector<ScheduleOp> ops;          // in the order the CPU issues them, all streams
  std::vector<std::string> persistent;  // buffers alive across steps (shards, sharded grads)
};

// Builds one training step (forward over units 0..N-1, backward N-1..0) as the runtime in
// src/runtime/param_group.cpp and root_state.cpp issues it. Throws on bad options.
StreamSchedule build_stream_schedule(const ScheduleOptions& options);

// Every violated invariant, one string each naming the unit, op and event or buffer; empty
// when the schedule is sound. (a) frees ordered after every use, on the allocating stream;
// (b) no wait on an event not yet recorded in issue order; (c) every read ordered after a
// write through program order and events; (d) at most kMaxReductionsInFlight unfinished
// reduce-scatters when one is issued, and the peaks below within their bounds.
std::vector<std::string> check_schedule(const StreamSchedule& schedule);

// The peak number of simultaneously live unsharded parameter buffers, and of all-gather
// buffers, in issue order (a buffer is live from its first write to its free).
int peak_unsharded(const StreamSchedule& schedule);
int peak_gathered(const StreamSchedule& schedule);
// The bounds check_schedule holds those peaks to: unsharded 1 with resharding after forward,
// else N; all-gather buffers min(N, 1 + prefetch), the prefetch depth's memory bound.
int max_unsharded(const ScheduleOptions& options);
int max_gathered(const ScheduleOptions& options);

// The collectives in issue order, "all_gather 3", "reduce_scatter 3", "all_reduce 3".
std::vector<std::string> collective_order(const StreamSchedule& schedule);

// "all_gather[3]@bwd on all-gather" style name of an op, for messages.
std::string describe(const ScheduleOp& op);
const char* to_string(ScheduleStream stream);
const char* to_string(ScheduleOpKind kind);

// One row per op, one column per stream, with its waits, records and frees: the diagram in
// docs/design.md.
std::string to_text(const StreamSchedule& schedule);

}  // namespace fsdp
