// Private to src/comm: the gloo backend's factory. Nothing from gloo appears here; callers see
// only the ProcessGroup interface and c10d's Store, which the public rendezvous header already
// exposes.
//
// Counts as every queued backend does (src/comm/queued_process_group.h); its reduce-scatter
// sent_bytes are exactly what our ring sends.
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
