// Unsharder: how one FSDP unit's parameters are gathered from their shards (the unit's
// placement), behind one interface, so that the unit's state machine (ParamGroup) issues,
// completes and drops a gather the same way whatever the placement:
//   - Shard(0) per parameter (make_shard_unsharder, shard_unsharder.cpp): one all-gather of the
//     unit's flat shards over the shard group (or, hpZ, of this rank's post-forward piece within
//     its group of N), copied out into each parameter's unsharded tensor, on the stream
//     schedule of stream_schedule.h;
//   - whole tensors (inter-tensor ZeRO-3, make_whole_tensor_unsharder,
//     whole_tensor_unsharder.cpp): one broadcast per owner of the unit's tensors, copied out
//     or aliased, waited on by the host.
// The state machine owns the states and the gather in flight (a PendingGather, set exactly in
// ParamGroup's kGathering); the unsharder owns the collectives, their buffers and the copy-out.
// Every byte of a gather's buffer is counted in the rank's stats from issue() to its release.
#pragma once

#include "runtime/device_streams.h"
#include "runtime/fsdp_param.h"
#include "runtime/owner_buckets.h"
#include "runtime/unit_context.h"

#include <fsdp/comm/comm_hooks.h>
#include <fsdp/comm/process_group.h>
#include <fsdp/util/trace.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace fsdp::detail {

// A unit's gather in flight.
struct PendingGather {
  WorkHandle work;
  // The shards copied in (cast to the compute dtype, or copied from the host with offload), or
  // the hpZ piece; else undefined (the all-gather reads the flat shards themselves).
  at::Tensor input;
  // hpZ: the post-forward group the piece is gathered over (null: the shard group), and the
  // piece's bytes, counted as unsharded until the gather completes.
  ProcessGroup* group = nullptr;
  int64_t piece_bytes = 0;
  StreamEvent piece_ready;  // recorded on compute once the piece was written
  at::Tensor buffer;        // [W * shard numel], or the broadcasts' received tensors
  RuntimeObserver::Clock::time_point issued;
  const char* phase = "fwd";  // which gather of the step, for the schedule's names
  StreamEvent copied_in;      // recorded on the copy-in stream once the input is ready
  StreamEvent gathered;       // recorded on the all-gather stream after the collective
};

// What both placements read of their unit: its context, its parameters and flat shards (the
// unit's own, which outlive the unsharder), the compute dtype of the unsharded parameters, and
// whether the shards live on the host while the mesh computes on a device.
struct UnsharderArgs {
  const UnitContext& unit;
  std::vector<FSDPParam>& params;
  const at::Tensor& flat_shards;
  at::ScalarType compute_dtype;
  bool offload_to_host;
};

class Unsharder {
 public:
  virtual ~Unsharder() = default;

  // Starts the gather of the unit's parameters into pending (its phase, and for hpZ its input,
  // group and piece_bytes, already set) and counts its buffers. On failure, takes them off the
  // books again and throws with the unit's context.
  virtual void issue(PendingGather& pending) = 0;
  // Completes an issued gather: waits for it where the host must, copies the gathered values
  // out into the unsharded parameters and releases the buffers. Returns the phase the unsharded
  // parameters now hold, for the schedule's names; null when the placement's copy-out is not on
  // the schedule. Throws (with the buffers off the books) if the collective failed.
  virtual const char* complete(PendingGather& pending) = 0;
  // Completes a gather whose values are not wanted (a prefetch whose unit never ran: every rank
  // issued it) and releases its buffers.
  virtual void drop(PendingGather& pending) = 0;
  // set_custom_all_gather: the gather's collective (null: the process group's own). The caller
  // has checked that the placement has an all-gather to replace.
  virtual void set_all_gather_hook(std::shared_ptr<AllGather> hook) = 0;
};

std::unique_ptr<Unsharder> make_shard_unsharder(const UnsharderArgs& args);
std::unique_ptr<Unsharder> make_whole_tensor_unsharder(const UnsharderArgs& args,
                                                       std::vector<OwnerBucket> buckets);

// Takes a gather's buffer and hpZ piece off the books once they are released, and the unit's
// count too unless the gather completed (gathered: the unit is now unsharded).
inline void uncount_gather(const UnitContext& unit, const PendingGather& pending, bool gathered) {
  unit.held(HeldKind::kCommBuffers, -pending.buffer.nbytes());
  unit.held(HeldKind::kUnshardedParams, -pending.piece_bytes);
  if (!gathered) unit.held(HeldKind::kUnshardedUnits, -1);
}

}  // namespace fsdp::detail
