// RuntimeObserver: what the FSDP runtime reports while it runs, for whoever keeps accounts or
// draws timelines. See [Note: the runtime reports to an observer].
//
// [Note: the runtime reports to an observer]
// The runtime's domain objects (the mesh, the units, their unsharders and reducers) do not keep
// accounts or timelines themselves: each unit reports to the observer given in its
// FullyShardOptions, and nothing when none is given. Three kinds of report:
//   - held(kind, delta): a live count changed: bytes of unsharded parameters, of unsharded
//     gradients, of communication buffers, or (kUnshardedUnits) the number of units unsharded or
//     with an all-gather in flight. Each increase is matched by a decrease of the same size.
//   - waited(seconds): the compute path blocked on a collective for this long (exposed
//     communication).
//   - span(...): one compute (a unit's forward or backward), comm (a collective from issue to
//     completion, with its bytes) or copy (copy-out after an all-gather, copy-in before a
//     reduction) interval, only while records_spans() is true, so that a run without a
//     timeline reads no clocks for it.
//   - stream_op(op, unit): one op the tree issues on its streams, in issue order, only while
//     records_schedule() is true: the vocabulary of build_stream_schedule (stream_schedule.h),
//     with op.unit -1 and the unit's path in the buffer and event names ("ag_buf[blocks.1]@fwd")
//     and in unit ("" for a release). A tree's streams are one, so these go to the root unit's
//     observer only. On a device without streams (CPU) the runtime reports the ops it would
//     issue on one, while its work runs in program order on the calling thread. For tests and
//     debugging: a recorded step can be compared with the built one and checked.
// Reports come from whatever thread does the work (autograd's, the ranks' own); an observer
// must be thread-safe. RankMonitor is the observer fsdp-train and the tests use: RankStats for
// the counts (live and peak) and a Tracer for the spans. Give every unit of a tree the same
// observer to account for the whole tree.
#pragma once

#include <fsdp/runtime/stream_schedule.h>
#include <fsdp/util/stats.h>
#include <fsdp/util/trace.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace fsdp {

enum class HeldKind { kUnshardedParams, kUnshardedGrads, kCommBuffers, kUnshardedUnits };

// Every report is a no-op here: override what you need.
class RuntimeObserver {
 public:
  using Clock = std::chrono::steady_clock;
  virtual ~RuntimeObserver() = default;

  virtual void held(HeldKind /*kind*/, int64_t /*delta*/) {}
  virtual void waited(double /*seconds*/) {}
  virtual bool records_spans() const { return false; }
  // category: "compute", "comm" or "copy"; unit: the unit's label; bytes: a collective's
  // (-1 otherwise); track: the row a timeline draws it on ("compute" or "comm").
  virtual void span(const char* /*category*/, const std::string& /*name*/,
                    Clock::time_point /*begin*/, Clock::time_point /*end*/,
                    const std::string& /*unit*/, int64_t /*bytes*/, const char* /*track*/) {}
  virtual bool records_schedule() const { return false; }
  virtual void stream_op(ScheduleOp /*op*/, const std::string& /*unit*/) {}
};

// The per-rank accounts (RankStats) and timeline (Tracer, off until enabled) of the units that
// report to it.
class RankMonitor : public RuntimeObserver {
 public:
  RankStats& stats() { return stats_; }
  const RankStats& stats() const { return stats_; }
  Tracer& tracer() { return tracer_; }

  void held(HeldKind kind, int64_t delta) override;
  void waited(double seconds) override { stats_.add_exposed_comm(seconds); }
  bool records_spans() const override { return tracer_.enabled(); }
  void span(const char* category, const std::string& name, Clock::time_point begin,
            Clock::time_point end, const std::string& unit, int64_t bytes,
            const char* track) override {
    tracer_.complete(category, name, begin, end, unit, bytes, track);
  }

 private:
  RankStats stats_;
  Tracer tracer_;
};

}  // namespace fsdp
