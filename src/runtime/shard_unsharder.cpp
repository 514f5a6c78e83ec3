// The Shard(0) placement's unshard (FSDP2's foreach_all_gather and foreach_all_gather_copy_out):
// see unsharder.h.
//
// Invariants: the all-gather's input is the unit's flat shards themselves (one flat buffer, so
// there is no copy-in) unless the compute dtype differs or the shards live on the host, and its
// output is the [W, S] buffer whose row r is rank r's shards; copy-out re-fills each parameter's
// unsharded storage in place from its column range. Every step that hands work to another stream
// is a DeviceStreams::Op on the role stream_schedule.h gives it: copy-in and the buffer's
// allocation on the copy-in stream, the collective on the all-gather stream, copy-out on
// compute; buffers are released on the stream that allocated them once their last reader's
// event was waited on. In program order (CPU) the host waits for the collective before the
// copy-out instead.
#include "runtime/unsharder.h"

#include "runtime/custom_collectives.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <utility>

namespace fsdp::detail {
namespace {

class ShardUnsharder : public Unsharder {
 public:
  explicit ShardUnsharder(const UnsharderArgs& args) : a_(args) {}

  void issue(PendingGather& pending) override;
  const char* complete(PendingGather& pending) override;
  void drop(PendingGather& pending) override;
  void set_all_gather_hook(std::shared_ptr<AllGather> hook) override { hook_ = std::move(hook); }

 private:
  // Copies the shards in for an all-gather (copy-in stream) and allocates its output there.
  void copy_in(PendingGather& pending);
  // Issues the all-gather on its stream; the caller owns the error handling.
  void issue_gather(PendingGather& pending);
  // Copies the gathered values out into the unsharded parameters; returns the event after it.
  StreamEvent copy_out(PendingGather& pending);
  // Frees a completed or dropped gather's buffers on the streams that allocated them.
  void release(PendingGather& pending, const StreamEvent& last_read);

  UnsharderArgs a_;
  std::shared_ptr<AllGather> hook_;  // null: the process group's own
};

void ShardUnsharder::issue(PendingGather& pending) {
  copy_in(pending);
  a_.unit.held(HeldKind::kCommBuffers, pending.buffer.nbytes());
  a_.unit.held(HeldKind::kUnshardedUnits, 1);
  pending.issued = RuntimeObserver::Clock::now();
  try {
    issue_gather(pending);
  } catch (const std::exception& e) {
    uncount_gather(a_.unit, pending, /*gathered=*/false);
    a_.unit.rethrow_with_context("all-gather of parameters", e);
  }
}

void ShardUnsharder::copy_in(PendingGather& pending) {
  DeviceStreams& streams = a_.unit.streams();
  // Earlier gathers' buffers are released first, so the caching allocator can reuse them.
  streams.flush(ScheduleStream::kCopyIn);
  DeviceStreams::Op op(streams, ScheduleStream::kCopyIn, ScheduleOpKind::kCopyIn, a_.unit.label());
  op.wait_for_step_begin();
  if (pending.piece_bytes > 0) {
    op.wait(pending.piece_ready).reads("piece");
  } else {
    op.reads("shard");
    const bool cast = a_.compute_dtype != a_.flat_shards.scalar_type();
    if (cast || a_.offload_to_host) {
      SpanScope trace(a_.unit, "copy", "copy-in");
      pending.input = a_.offload_to_host
                          ? a_.flat_shards.to(a_.unit.device_options(a_.compute_dtype),
                                              /*non_blocking=*/true)
                          : a_.flat_shards.to(a_.compute_dtype);
      op.writes("ag_in", pending.phase);
    }
  }
  pending.buffer =
      allocate_gather_buffer(hook_.get(), a_.unit.mesh().shard_size() * a_.flat_shards.numel(),
                             a_.unit.device_options(a_.compute_dtype), a_.unit.label());
  op.writes("ag_buf", pending.phase);
  pending.copied_in = op.record("copied_in", pending.phase);
}

void ShardUnsharder::issue_gather(PendingGather& pending) {
  DeviceStreams::Op op(a_.unit.streams(), ScheduleStream::kAllGather, ScheduleOpKind::kAllGather,
                       a_.unit.label());
  op.wait(pending.copied_in);
  if (!pending.input.defined()) {
    op.reads("shard");
  } else if (pending.piece_bytes > 0) {
    op.reads("piece");
  } else {
    op.reads("ag_in", pending.phase);
  }
  op.writes("ag_buf", pending.phase);
  const CollectiveLabel collective_label(a_.unit.label());
  ProcessGroup& group = pending.group != nullptr ? *pending.group : a_.unit.mesh().shard_group();
  pending.work =
      start_all_gather(hook_.get(), group, pending.buffer,
                       pending.input.defined() ? pending.input : a_.flat_shards, a_.unit.label());
  a_.unit.order_stream_after(pending.work);
  pending.gathered = op.record("gathered", pending.phase);
}

const char* ShardUnsharder::complete(PendingGather& pending) {
  // With streams, copy-out's wait on the gather's event orders compute instead.
  if (a_.unit.streams().in_program_order()) {
    try {
      a_.unit.wait_for(pending.work, "all-gather of parameters");
    } catch (...) {
      uncount_gather(a_.unit, pending, /*gathered=*/false);
      throw;
    }
  }
  a_.unit.span("comm", "all-gather", pending.issued, pending.work->finished_at(),
               pending.buffer.nbytes(), "comm");
  const StreamEvent copied_out = copy_out(pending);
  uncount_gather(a_.unit, pending, /*gathered=*/true);
  release(pending, copied_out);
  return pending.phase;
}

StreamEvent ShardUnsharder::copy_out(PendingGather& pending) {
  DeviceStreams::Op op(a_.unit.streams(), ScheduleStream::kCompute, ScheduleOpKind::kCopyOut,
                       a_.unit.label());
  op.wait(pending.gathered).reads("ag_buf", pending.phase).writes("unsharded", pending.phase);
  SpanScope trace(a_.unit, "copy", "copy-out");
  const at::Tensor gathered_2d =
      pending.buffer.view({a_.unit.mesh().shard_size(), a_.flat_shards.numel()});
  int64_t column = 0;
  for (auto& p : a_.params) {
    p.unshard_from(gathered_2d, column);
    a_.unit.held(HeldKind::kUnshardedParams, p.unsharded_bytes());
    column += p.padded_numel();
  }
  return op.record("copied_out", pending.phase);
}

void ShardUnsharder::release(PendingGather& pending, const StreamEvent& last_read) {
  DeviceStreams& streams = a_.unit.streams();
  const std::string& label = a_.unit.label();
  if (pending.piece_bytes > 0) {
    // The hpZ piece was made on compute; compute has waited on (or now waits on) the gather.
    streams.release_after(ScheduleStream::kCompute, std::move(pending.input), pending.gathered,
                          "piece", label);
    streams.flush(ScheduleStream::kCompute);
  } else if (pending.input.defined()) {
    streams.release_after(ScheduleStream::kCopyIn, std::move(pending.input), pending.gathered,
                          "ag_in", label, pending.phase);
  }
  streams.release_after(ScheduleStream::kCopyIn, std::move(pending.buffer), last_read, "ag_buf",
                        label, pending.phase);
}

void ShardUnsharder::drop(PendingGather& pending) {
  uncount_gather(a_.unit, pending, /*gathered=*/false);
  if (a_.unit.streams().in_program_order()) {
    a_.unit.wait_for(pending.work, "all-gather of parameters");
  }
  release(pending, pending.gathered);
}

}  // namespace

std::unique_ptr<Unsharder> make_shard_unsharder(const UnsharderArgs& args) {
  return std::make_unique<ShardUnsharder>(args);
}

}  // namespace fsdp::detail
