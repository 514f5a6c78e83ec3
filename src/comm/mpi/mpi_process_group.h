// Private to src/comm: the MPI backend's factory and its part in launching. Built only when
// CMake finds MPI (FSDP_WITH_MPI); nothing from mpi.h appears here.
//
// The ranks of an MPI group are the processes mpirun (or srun --mpi=pmix) started: MPI cannot
// put several ranks in one process, so ranks-as-threads groups are gloo's alone.
#pragma once

#include <fsdp/comm/process_group.h>
#include <fsdp/comm/rendezvous.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>

namespace fsdp::detail {

// This rank's handle on the world of MPI processes, which must be world_size processes with
// this one at rank (the launch's numbering). store (private to this group) is where subgroups
// wait for their members, with a deadline, before MPI forms them. Initializes MPI on first use
// (MPI_THREAD_MULTIPLE: every group has its own progress thread). Throws naming both numbers
// when MPI's world is not the launch's, for instance under torchrun, which starts every rank as
// an MPI world of one.
std::shared_ptr<ProcessGroup> make_mpi_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                     int rank, int world_size,
                                                     const ProcessGroupOptions& options);

// Under mpirun without MASTER_ADDR: rank 0 binds a listening socket on every interface for the
// rendezvous store and broadcasts its address and port over MPI, so that `mpirun -np N prog`
// needs no other setting. Fills env.master_addr, env.master_port and, on rank 0,
// env.master_listen_fd. The address is 127.0.0.1 when every rank is on this host
// (env.local_world_size equals the world size), else rank 0's host name.
void share_master_over_mpi(LaunchEnv& env);

}  // namespace fsdp::detail
