// Private to src/comm: the gloo backend's factory. Nothing from gloo appears here; callers see
// only the ProcessGroup interface and c10d's Store, which the public rendezvous header already
// exposes.
//
// Counter conventions of this backend (see CommCounters in include/fsdp/comm/process_group.h):
//   calls and payload_bytes are counted when an op is queued; sent_bytes when it succeeds.
//   reduce_scatter.sent_bytes: the bytes our ring really sent, (W-1)/W of the input, exactly.
//   all_gather.sent_bytes:     (W-1) x input bytes = (W-1)/W of the output, what a ring all-gather
//                              sends (c10d runs gloo's all-gather; we cannot observe its wire).
//   all_reduce.sent_bytes:     floor(2 (W-1) bytes / W), a ring all-reduce (reduce-scatter then
//                              all-gather), whatever algorithm gloo picks.
//   broadcast.sent_bytes:      the tensor's bytes on the root, 0 elsewhere (the logical source of
//                              the data, not gloo's tree).
//   barrier is not counted. At W = 1 nothing is sent and sent_bytes stays 0.
#pragma once

#include <fsdp/comm/process_group.h>
#include <fsdp/comm/rendezvous.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>

namespace fsdp::detail {

// This rank's handle on a world_size-rank gloo group. store must be private to this group (the
// caller prefixes it) because gloo's own rendezvous writes fixed key names. Blocks until every
// rank connected, and throws, naming the rank and the timeout, after options.timeout.
std::shared_ptr<ProcessGroup> make_gloo_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                      int rank, int world_size,
                                                      const ProcessGroupOptions& options);

}  // namespace fsdp::detail
