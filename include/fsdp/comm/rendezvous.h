// Creating process groups: from torchrun-style environment variables over c10d's TCPStore,
// or in-process with one thread per rank (for tests).
#pragma once

#include <fsdp/comm/process_group.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fsdp {

// A TCP socket on 127.0.0.1 bound to a port the kernel chose, held open until destroyed (or
// released). Choosing a "free" port and binding it later races with every other launcher on
// the machine; binding first and handing the bound socket on does not. listen = false leaves it
// bound but not listening, so that connecting to port() is refused for as long as it is held.
// Throws with the system's reason when no socket can be bound.
class LoopbackSocket {
 public:
  explicit LoopbackSocket(bool listen = true);
  ~LoopbackSocket();
  LoopbackSocket(const LoopbackSocket&) = delete;
  LoopbackSocket& operator=(const LoopbackSocket&) = delete;

  int fd() const { return fd_; }
  int port() const { return port_; }
  // Clears close-on-exec, so that a child started with exec inherits the socket (pass it on as
  // FSDP_MASTER_LISTEN_FD). The socket stays owned here.
  void inherit_across_exec();
  // Gives up ownership: returns fd() and will not close it (e.g. a TCPStore took it over).
  int release();

 private:
  int fd_ = -1;
  int port_ = 0;
};

struct ProcessGroupOptions {
  // The communication backend: "gloo" (CPU tensors; every build has it), "mpi" (CPU tensors,
  // ranks started by mpirun or srun --mpi=pmix; builds that found MPI) or "nccl" (CUDA tensors
  // of the calling thread's current device; builds with a CUDA-enabled LibTorch).
  // available_backends() lists this build's. (optional) defaults to the launch's:
  // default_backend(env) for a group formed from a LaunchEnv (mpi under mpirun, where this build
  // has it; see [Note: the default backend follows the launch]), "gloo" for ranks as threads.
  std::string backend;
  // How long any collective, and the rendezvous itself, may take before it fails with an
  // error naming the rank and the operation. (optional) defaults to 300 s.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // Address this rank's transport binds to, which the other ranks connect to. (optional)
  // defaults to $FSDP_HOSTNAME, else, for a group formed from a LaunchEnv, the address of the
  // interface that routes to MASTER_ADDR (127.0.0.1 when the master is this host's loopback),
  // and 127.0.0.1 for ranks as threads.
  std::string hostname;
  // Where each rank writes its flight record (its last collectives, as JSON) when a collective
  // fails or times out. (optional) defaults to $FSDP_FLIGHT_RECORDER_DIR, else the working
  // directory.
  std::string flight_recorder_dir;
  // How many of its last collectives each group keeps for that record. (optional) defaults to
  // 2048.
  int64_t flight_recorder_entries = 2048;
  // The CUDA device whose tensors an nccl group moves (group->device() says which it is); taken
  // modulo the number of visible devices. (optional) defaults, for a group formed from a
  // LaunchEnv, to its local_rank (torchrun's convention: one GPU per local rank), else to the
  // calling thread's current CUDA device. Other backends ignore it.
  std::optional<int> cuda_device;
  // Check before every collective that all ranks issue the same one (op, dtype, size, unit),
  // for one extra small all-gather each: a desync then fails at once, naming each rank's
  // collective, instead of timing out. (optional) defaults to on when the environment has
  // FSDP_DEBUG=collectives.
  std::optional<bool> check_collectives;
};

// Who a rank is and where the rendezvous store is: what torchrun exports (RANK, WORLD_SIZE,
// LOCAL_RANK, MASTER_ADDR, MASTER_PORT), or what Slurm's srun or Open MPI's mpirun does (see
// launch_env_from_environment).
struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  // How many ranks run on this host (LOCAL_WORLD_SIZE, SLURM_NTASKS_PER_NODE,
  // OMPI_COMM_WORLD_LOCAL_SIZE), for dividing its cores. (optional) defaults to world_size.
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // Open MPI's mpirun started this rank (so the mpi backend is the default).
  bool launched_by_mpirun = false;
  // mpirun gave no MASTER_ADDR: init_process_group learns the store's address over MPI (rank 0
  // binds a port and broadcasts it), and master_addr and master_port are unset until then.
  bool master_from_mpi = false;
  // Rank 0 only: a socket already bound to master_port and listening, which the store takes
  // over instead of binding the port itself (see LoopbackSocket). (optional) defaults to none.
  std::optional<int> master_listen_fd;
  // Every rank connects to a store that the launcher already hosts at MASTER_ADDR:MASTER_PORT
  // (torchrun's agent store: TORCHELASTIC_USE_AGENT_STORE=True), so rank 0 hosts none.
  // (optional) defaults to false.
  bool launcher_hosts_store = false;
};

// Reads the torchrun variables, plus TORCHELASTIC_USE_AGENT_STORE (torchrun sets it when its
// agent hosts the store on MASTER_PORT) and FSDP_MASTER_LISTEN_FD (fsdp-train --nproc hands
// rank 0 the bound socket). Without RANK, Slurm's: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID,
// the master from MASTER_ADDR or the first host of SLURM_JOB_NODELIST, and MASTER_PORT or
// 20000 + SLURM_JOB_ID % 20000. Without either, Open MPI's: OMPI_COMM_WORLD_RANK, _SIZE,
// _LOCAL_RANK, _LOCAL_SIZE, with MASTER_ADDR and MASTER_PORT (or 29500) when given; without
// MASTER_ADDR a build with MPI learns the master over MPI (master_from_mpi), and one without
// MPI throws saying to pass it (mpirun -x MASTER_ADDR=...).
// Throws, naming the variable and its value, when one is missing or
// malformed, or when RANK is outside [0, WORLD_SIZE).
LaunchEnv launch_env_from_environment();

// Whether a launcher made this process one rank of a job, so that launch_env_from_environment
// describes it: torchrun (RANK), Slurm's srun (SLURM_PROCID) or Open MPI's mpirun
// (OMPI_COMM_WORLD_RANK). A program that launches local ranks itself must not then.
bool launched_by_a_launcher();

// The communication backends this build has, "gloo" first.
std::vector<std::string> available_backends();

// The backend a job launched as env describes uses unless told otherwise: "mpi" when mpirun
// started it and this build has MPI, else "gloo" (torchrun, srun and --nproc launches).
// init_process_group(env) uses it when ProcessGroupOptions::backend is empty.
std::string default_backend(const LaunchEnv& env);

// Joins the group described by env: rank 0 hosts a c10d TCPStore at MASTER_ADDR:MASTER_PORT,
// every rank checks that all agree on WORLD_SIZE and waits for the others. Throws with the
// missing ranks named if they do not all arrive within options.timeout, and with both values
// named if two ranks disagree on the world size. Blocks until the group is formed.
std::shared_ptr<ProcessGroup> init_process_group(const LaunchEnv& env,
                                                 const ProcessGroupOptions& options = {});

// A key-value store that ranks rendezvous over, shared by the groups made over it (each gets
// keys of its own). Opaque: the c10d store behind it stays out of this header.
class RendezvousStore {
 public:
  struct Impl;
  explicit RendezvousStore(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
  Impl& impl() const { return *impl_; }

 private:
  std::shared_ptr<Impl> impl_;
};

// A store in this process's memory, for ranks run as threads. Operations on it wait at most
// timeout for a key.
RendezvousStore make_in_process_store(std::chrono::milliseconds timeout);

// Same as init_process_group(env), over an existing store (ranks as threads share one).
std::shared_ptr<ProcessGroup> init_process_group(const RendezvousStore& store, int rank,
                                                 int world_size,
                                                 const ProcessGroupOptions& options = {});

// Runs fn(group) on world_size threads, one rank each, over an in-process store, and joins
// them. Each thread gets one intra-op thread. If any rank throws, the first error (by rank) is
// rethrown here after all threads finished; ranks blocked in collectives with a failed peer
// end by timeout, so keep options.timeout short in tests.
void run_ranks_in_threads(int world_size,
                          const std::function<void(std::shared_ptr<ProcessGroup>)>& fn,
                          const ProcessGroupOptions& options = {});

}  // namespace fsdp
