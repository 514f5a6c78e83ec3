// Private to src/comm: what a launcher other than torchrun (srun, mpirun) tells a rank, and which
// address its transport should bind so that the other hosts reach it.
#pragma once

#include <fsdp/comm/rendezvous.h>

#include <optional>
#include <string>

namespace fsdp::detail {

// The launch described by Slurm's srun variables: SLURM_PROCID (rank), SLURM_NTASKS (world
// size), SLURM_LOCALID (local rank), SLURM_NTASKS_PER_NODE or SLURM_TASKS_PER_NODE (the local
// world size: the first node's count of "2(x3),1"), and the master, the first host of
// SLURM_JOB_NODELIST (or SLURM_NODELIST) unless MASTER_ADDR is set; the port is MASTER_PORT, else
// 20000 + SLURM_JOB_ID % 20000 (one port per job, so jobs sharing a node do not collide), else
// 29500. nullopt when SLURM_PROCID is not set. Throws naming a variable that is missing or
// malformed.
std::optional<LaunchEnv> launch_env_from_slurm();

// The launch described by Open MPI's mpirun variables: OMPI_COMM_WORLD_RANK, _SIZE,
// _LOCAL_RANK and _LOCAL_SIZE; the master is MASTER_ADDR when the job passes it (mpirun -x
// MASTER_ADDR=...), else left to MPI (master_from_mpi, see bootstrap.h's resolve_master); the
// port MASTER_PORT, else 29500. nullopt when OMPI_COMM_WORLD_RANK is not set. Throws naming a
// variable that is malformed.
std::optional<LaunchEnv> launch_env_from_open_mpi();

// Whether srun or mpirun started this process (SLURM_PROCID or OMPI_COMM_WORLD_RANK is set).
bool cluster_launcher_present();

// The first host of a Slurm host list: "node[03-05,9],gpu1" gives "node03", "a,b" gives "a".
// Throws naming the list when it is empty or malformed.
std::string first_host_of(const std::string& hostlist);

// The address this host uses to reach host (the source address of a route to it), which the
// transport binds so that peers on other hosts can connect: "127.0.0.1" for a loopback host.
// $FSDP_HOSTNAME overrides it. Throws naming host when it does not resolve or has no route.
std::string transport_address_towards(const std::string& host);

}  // namespace fsdp::detail
