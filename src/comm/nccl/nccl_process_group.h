// Private to src/comm: the NCCL backend's factory. Built when CMake finds a CUDA-enabled LibTorch
// and NCCL's header (FSDP_WITH_NCCL); nothing from nccl.h or the CUDA runtime appears here.
//
// A group of this backend moves the tensors of one CUDA device: options.cuda_device modulo the
// number of visible devices (init_process_group fills in the launch's local rank), else the
// calling thread's current device when the group is made. Subgroups keep their parent's. Its
// collectives run on c10d's ProcessGroupNCCL, whose NCCL stream waits for the caller's current
// stream when an op is issued.
#pragma once

#include <fsdp/comm/process_group.h>
#include <fsdp/comm/rendezvous.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>

namespace fsdp::detail {

// This rank's handle on a world_size-rank NCCL group over store (private to this group). Blocks
// until every rank's communicator is connected. Throws, naming the fault, when this process sees
// no CUDA device, and naming the rank and the timeout when the others do not connect in time.
//
// Work::wait() of its collectives blocks the calling thread until the op completed on the
// device, or throws after options.timeout from the issue (naming the rank and the op, and
// aborting the communicator: the group is broken from then on); after it returns, the caller's
// current CUDA stream is ordered after the op too. Work::wait_on_stream() returns at once; the
// group's watchdog then applies the same deadline, and on expiry breaks the group (the next
// call throws the timeout message) and aborts the communicator. A collective whose issue
// blocks in NCCL past the deadline (a peer that never joins its first use of an algorithm)
// throws the same way from the call itself.
std::shared_ptr<ProcessGroup> make_nccl_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                      int rank, int world_size,
                                                      const ProcessGroupOptions& options);

}  // namespace fsdp::detail
