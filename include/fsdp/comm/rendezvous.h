// Creating process groups: from torchrun-style environment variables over c10d's TCPStore,
// or in-process with one thread per rank (for tests).
#pragma once

#include <fsdp/comm/process_group.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

namespace fsdp {

// A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, read back, released),
// for MASTER_PORT when launching local ranks.
int find_free_tcp_port();

struct ProcessGroupOptions {
  // How long any collective, and the rendezvous itself, may take before it fails with an
  // error naming the rank and the operation. (optional) defaults to 300 s.
  std::chrono::milliseconds timeout{std::chrono::seconds(300)};
  // Address this rank's gloo transport binds to. (optional) defaults to 127.0.0.1, which serves
  // every rank of one machine; set it to a routable address for multi-node runs.
  std::string hostname = "127.0.0.1";
};

// What torchrun exports: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT.
struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
};

// Reads the torchrun variables. Throws, naming the variable and its value, when one is missing
// or malformed, or when RANK is outside [0, WORLD_SIZE).
LaunchEnv launch_env_from_environment();

// Joins the group described by env: rank 0 hosts a c10d TCPStore at MASTER_ADDR:MASTER_PORT,
// every rank checks that all agree on WORLD_SIZE and waits for the others. Throws with the
// missing ranks named if they do not all arrive within options.timeout, and with both values
// named if two ranks disagree on the world size. Blocks until the group is formed.
std::shared_ptr<ProcessGroup> init_process_group(const LaunchEnv& env,
                                                 const ProcessGroupOptions& options = {});

// Same, over an existing store (ranks as threads share a c10d::HashStore).
std::shared_ptr<ProcessGroup> init_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                 int rank, int world_size,
                                                 const ProcessGroupOptions& options = {});

// Runs fn(group) on world_size threads, one rank each, over an in-process store, and joins
// them. Each thread gets one intra-op thread. If any rank throws, the first error (by rank) is
// rethrown here after all threads finished; ranks blocked in collectives with a failed peer
// end by timeout, so keep options.timeout short in tests.
void run_ranks_in_threads(int world_size,
                          const std::function<void(std::shared_ptr<ProcessGroup>)>& fn,
                          const ProcessGroupOptions& options = {});

}  // namespace fsdp
