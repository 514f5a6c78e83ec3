// Private to src/comm: the group every backend is wrapped in, which keeps the flight recorder.
//
// make_recording_group(inner, ...) returns a ProcessGroup that forwards every call to inner and
// records each collective (sequence number, op, CollectiveLabel, dtype, size, state, times).
// When a collective fails or times out, each rank
// - writes its records as JSON to <flight_recorder_dir>/fsdp_flight_recorder_<group>_rank<R>.json,
// - publishes them on the group's store and reads the other ranks' for a few seconds,
// - and throws the backend's error followed by where the ranks diverged, for instance
//   "the ranks diverge at collective #57: rank 0 is at all-gather #57 (unit h.3, ...), rank 1 at
//   reduce-scatter #57 (unit h.2, ...)".
// With check_collectives on, every collective is preceded by an all-gather of its fingerprint
// (op, dtype, element count, root, label), so a disagreement throws on every rank before the
// mismatched collective can hang or mix up data.
#pragma once

#include <fsdp/comm/process_group.h>
#include <fsdp/comm/rendezvous.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>
#include <string>

namespace fsdp::detail {

// inner wrapped with a flight recorder. store (private to this group; may be null, then only
// this rank's own records are reported) carries the records between ranks on failure. name
// identifies the group in file names and messages ("world", "world.replicate", ...).
std::shared_ptr<ProcessGroup> make_recording_group(std::shared_ptr<ProcessGroup> inner,
                                                   c10::intrusive_ptr<c10d::Store> store,
                                                   std::string name,
                                                   const ProcessGroupOptions& options);

}  // namespace fsdp::detail
