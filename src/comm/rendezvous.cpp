// Rendezvous: from "I am rank r of W" to a connected ProcessGroup.
//
// Invariants (the join protocol itself is in bootstrap.cpp):
// - run_ranks_in_threads keeps every successful rank's group alive until all ranks returned:
//   a rank that finished first must not close connections a peer still reads its last op from.
//   A rank that threw drops its group at once, so its peers fail fast instead of timing out.
#include <fsdp/comm/rendezvous.h>

#include "bootstrap.h"
#include "cluster_env.h"

#include <fsdp/util/error.h>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace fsdp {
namespace {

std::string rank_prefix(int rank, int world_size) {
  return "fsdp: rank " + std::to_string(rank) + " of " + std::to_string(world_size) + ": ";
}

std::optional<std::string> read_env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) {
    return std::nullopt;
  }
  return std::string(value);
}

std::string require_env(const char* name) {
  auto value = read_env(name);
  TORCH_CHECK(value.has_value(), "fsdp: environment variable ", name,
              " is not set; launch with torchrun, or set RANK, WORLD_SIZE, LOCAL_RANK, "
              "MASTER_ADDR and MASTER_PORT");
  return *value;
}

// Strict: the whole value must be a decimal integer; "2x", "" and " 2" are rejected rather than
// read as 2 or 0.
int parse_int_env(const char* name, const std::string& value) {
  errno = 0;
  char* end = nullptr;
  const long parsed = std::strtol(value.c_str(), &end, 10);
  TORCH_CHECK(!value.empty() && end != value.c_str() && *end == '\0' && errno != ERANGE &&
                  parsed >= INT_MIN && parsed <= INT_MAX,
              "fsdp: environment variable ", name, "='", value, "' is not an integer");
  return static_cast<int>(parsed);
}

void check_launch_env(const LaunchEnv& env) {
  TORCH_CHECK(env.world_size >= 1, "fsdp: WORLD_SIZE=", env.world_size, " must be at least 1");
  TORCH_CHECK(env.rank >= 0 && env.rank < env.world_size, "fsdp: RANK=", env.rank,
              " is outside [0, WORLD_SIZE=", env.world_size, ")");
  TORCH_CHECK(env.local_rank >= 0, "fsdp: LOCAL_RANK=", env.local_rank, " must not be negative");
  TORCH_CHECK(env.local_world_size >= 1, "fsdp: the local world size ", env.local_world_size,
              " must be at least 1");
  TORCH_CHECK(env.master_from_mpi || !env.master_addr.empty(), "fsdp: MASTER_ADDR is empty");
  TORCH_CHECK(env.master_from_mpi || (env.master_port >= 1 && env.master_port <= 65535),
              "fsdp: MASTER_PORT=", env.master_port, " is not a TCP port (1..65535)");
  TORCH_CHECK(!env.master_listen_fd || (env.rank == 0 && !env.launcher_hosts_store),
              "fsdp: FSDP_MASTER_LISTEN_FD is for the rank that hosts the store (rank 0, when "
              "no launcher hosts it), not rank ",
              env.rank);
  TORCH_CHECK(!env.master_listen_fd || *env.master_listen_fd >= 0,
              "fsdp: FSDP_MASTER_LISTEN_FD=", env.master_listen_fd.value_or(0),
              " is not a file descriptor");
}

}  // namespace

bool launched_by_a_launcher() {
  return read_env("RANK").has_value() || detail::cluster_launcher_present();
}

LaunchEnv launch_env_from_environment() {
  if (!read_env("RANK")) {
    auto cluster = detail::launch_env_from_slurm();
    if (!cluster) cluster = detail::launch_env_from_open_mpi();
    if (cluster) {
      check_launch_env(*cluster);
      return *cluster;
    }
  }
  LaunchEnv env;
  env.world_size = parse_int_env("WORLD_SIZE", require_env("WORLD_SIZE"));
  env.rank = parse_int_env("RANK", require_env("RANK"));
  env.local_rank = parse_int_env("LOCAL_RANK", require_env("LOCAL_RANK"));
  const auto local_world = read_env("LOCAL_WORLD_SIZE");
  env.local_world_size =
      local_world ? parse_int_env("LOCAL_WORLD_SIZE", *local_world) : env.world_size;
  env.master_addr = require_env("MASTER_ADDR");
  env.master_port = parse_int_env("MASTER_PORT", require_env("MASTER_PORT"));
  // torchrun's agent already hosts a store on MASTER_PORT and says so here; a rank 0 that tried
  // to host another would fail to bind it.
  env.launcher_hosts_store = read_env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
  if (auto fd = read_env("FSDP_MASTER_LISTEN_FD")) {
    env.master_listen_fd = parse_int_env("FSDP_MASTER_LISTEN_FD", *fd);
  }
  check_launch_env(env);
  return env;
}

std::shared_ptr<ProcessGroup> init_process_group(const LaunchEnv& launch,
                                                 const ProcessGroupOptions& options) {
  check_launch_env(launch);
  LaunchEnv env = launch;
  detail::resolve_master(env);
  const std::string prefix = rank_prefix(env.rank, env.world_size);
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(env.master_port);
  store_options.isServer = env.rank == 0 && !env.launcher_hosts_store;
  store_options.masterListenFd = env.master_listen_fd;
  // The join protocol below waits for the workers and names the missing ones; c10d's own wait
  // would only say that some did not come.
  store_options.waitWorkers = false;
  store_options.timeout = options.timeout;
  // [Note: the default backend follows the launch]
  // A program written from the README calls init_process_group(env) without naming a backend.
  // Under mpirun the ranks' transport of choice is MPI (the cluster's fabric, the launcher's
  // own wire-up); gloo there would take the slow TCP path on every collective without saying
  // so. So the unnamed backend is the launch's: default_backend(env), as fsdp-train's
  // --backend auto picks it.
  ProcessGroupOptions resolved = options;
  if (resolved.backend.empty()) resolved.backend = default_backend(env);
  if (resolved.hostname.empty())
    resolved.hostname = detail::transport_address_towards(env.master_addr);
  if (!resolved.cuda_device) resolved.cuda_device = env.local_rank;
  c10::intrusive_ptr<c10d::Store> store;
  try {
    store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_options);
  } catch (const std::exception&) {
    const std::string detail = error_message(std::current_exception());
    if (env.rank == 0) {
      TORCH_CHECK(false, prefix, "could not host the rendezvous store on MASTER_ADDR:MASTER_PORT=",
                  env.master_addr, ":", env.master_port, ": ", detail);
    }
    TORCH_CHECK(false, prefix, "could not reach the rendezvous store of rank 0 at MASTER_ADDR:",
                "MASTER_PORT=", env.master_addr, ":", env.master_port, " within ",
                options.timeout.count(), " ms (is rank 0 running with the same MASTER_ADDR and ",
                "MASTER_PORT?): ", detail);
  }
  return init_process_group(
      RendezvousStore(std::make_shared<RendezvousStore::Impl>(RendezvousStore::Impl{store})),
      env.rank, env.world_size, resolved);
}

RendezvousStore make_in_process_store(std::chrono::milliseconds timeout) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  store->setTimeout(timeout);
  return RendezvousStore(std::make_shared<RendezvousStore::Impl>(RendezvousStore::Impl{store}));
}

std::shared_ptr<ProcessGroup> init_process_group(const RendezvousStore& store, int rank,
                                                 int world_size,
                                                 const ProcessGroupOptions& options) {
  TORCH_CHECK(world_size >= 1, "fsdp: world size ", world_size, " must be at least 1");
  TORCH_CHECK(rank >= 0 && rank < world_size, "fsdp: rank ", rank, " is outside [0, world size ",
              world_size, ")");
  TORCH_CHECK(options.timeout.count() > 0,
              "fsdp: ProcessGroupOptions::timeout must be positive, got ", options.timeout.count(),
              " ms");
  ProcessGroupOptions resolved = options;
  if (resolved.backend.empty()) resolved.backend = "gloo";  // ranks as threads: one process
  return detail::make_backend_group(store.impl().store, rank, world_size, resolved);
}

void run_ranks_in_threads(int world_size,
                          const std::function<void(std::shared_ptr<ProcessGroup>)>& fn,
                          const ProcessGroupOptions& options) {
  TORCH_CHECK(world_size >= 1, "fsdp: run_ranks_in_threads: world size ", world_size,
              " must be at least 1");
  TORCH_CHECK(fn, "fsdp: run_ranks_in_threads needs a function, got an empty one");
  const RendezvousStore store = make_in_process_store(options.timeout);

  // at::set_num_threads writes a process-wide setting that every thread adopts on its first
  // parallel op (ATen's lazy per-thread init), so setting it here, before the ranks start, gives
  // each rank and its progress thread one intra-op thread. We put the old value back after the
  // ranks joined; the rank threads are gone by then. Not safe against a concurrent caller that
  // changes the thread count itself.
  const int saved_threads = at::get_num_threads();
  if (world_size > 1) {
    at::set_num_threads(1);
  }
  std::vector<std::shared_ptr<ProcessGroup>> groups(world_size);
  std::vector<std::exception_ptr> errors(world_size);
  {
    std::vector<std::thread> threads;
    threads.reserve(world_size);
    for (int r = 0; r < world_size; ++r) {
      threads.emplace_back([&, r] {
        try {
          groups[r] = init_process_group(store, r, world_size, options);
          fn(groups[r]);
        } catch (...) {
          errors[r] = std::current_exception();
          groups[r].reset();
        }
      });
    }
    for (auto& thread : threads) {
      thread.join();
    }
  }
  groups.clear();
  if (world_size > 1) {
    at::set_num_threads(saved_threads);
  }

  std::string message;
  for (int r = 0; r < world_size; ++r) {
    if (!errors[r]) {
      continue;
    }
    message += message.empty() ? "" : "\n(also) ";
    message += "rank " + std::to_string(r) + ": " + error_message(errors[r]);
  }
  TORCH_CHECK(message.empty(), message);
}

LoopbackSocket::LoopbackSocket(bool listen) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  TORCH_CHECK(fd_ >= 0, "fsdp: socket() failed: ", std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0 &&
                  (!listen || ::listen(fd_, SOMAXCONN) == 0);
  const int error = errno;
  if (!ok) {
    ::close(fd_);
    TORCH_CHECK(false, "fsdp: could not bind a socket on 127.0.0.1: ", std::strerror(error));
  }
  port_ = ntohs(addr.sin_port);
}

LoopbackSocket::~LoopbackSocket() {
  if (fd_ >= 0) ::close(fd_);
}

int LoopbackSocket::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

void LoopbackSocket::inherit_across_exec() {
  const int flags = ::fcntl(fd_, F_GETFD);
  TORCH_CHECK(flags >= 0 && ::fcntl(fd_, F_SETFD, flags & ~FD_CLOEXEC) == 0,
              "fsdp: fcntl on the store's socket failed: ", std::strerror(errno));
}

}  // namespace fsdp
