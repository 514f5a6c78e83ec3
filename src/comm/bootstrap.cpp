// Forming a group over a store, below every backend: the join protocol and the backend factory.
//
// Invariants of the join:
// - Before a backend is asked to connect (gloo's own timeout names nobody), the ranks join on
//   the store: each publishes its WORLD_SIZE under fsdp/<generation>/join/<rank> and polls until
//   it has seen all W join keys of its world, comparing every WORLD_SIZE it reads with its own.
//   So a rank that never came is named, and a disagreement is reported with both values by
//   every rank that meets it (rank 0 meets all of them).
// - <generation> counts, per rank, the groups made over this store. Every rank makes its groups
//   in the same order, so a second group over the same store gets fresh keys and never reads
//   the first one's join keys or transport addresses.
#include "bootstrap.h"

#include <fsdp/util/error.h>

#include "gloo/gloo_process_group.h"
#ifdef FSDP_WITH_MPI
#include "mpi/mpi_process_group.h"
#endif
#ifdef FSDP_WITH_NCCL
#include "nccl/nccl_process_group.h"
#endif
#include "recording_process_group.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <chrono>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace fsdp {
namespace detail {
namespace {

using Clock = std::chrono::steady_clock;

// How often a joining rank looks for the others. Short enough not to slow tests down, long
// enough that W ranks polling a TCPStore stay cheap.
constexpr auto kJoinPollInterval = std::chrono::milliseconds(5);

std::string rank_prefix(int rank, int world_size) {
  return "fsdp: rank " + std::to_string(rank) + " of " + std::to_string(world_size) + ": ";
}

std::string list_ranks(const std::vector<int>& ranks) {
  std::ostringstream out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    out << (i ? ", " : "") << ranks[i];
  }
  return out.str();
}

}  // namespace

std::string join_ranks(c10d::Store& store, int rank, int world_size,
                       std::chrono::milliseconds timeout) {
  const std::string prefix = rank_prefix(rank, world_size);
  const int64_t generation = store.add("fsdp/generation/" + std::to_string(rank), 1);
  const std::string base = "fsdp/" + std::to_string(generation) + "/";
  auto join_key = [&](int r) { return base + "join/" + std::to_string(r); };

  const std::string mine = std::to_string(world_size);
  store.set(join_key(rank), std::vector<uint8_t>(mine.begin(), mine.end()));

  const auto deadline = Clock::now() + timeout;
  std::vector<bool> seen(world_size, false);
  int missing = world_size;
  auto absent_ranks = [&] {
    std::vector<int> absent;
    for (int r = 0; r < world_size; ++r) {
      if (!seen[r]) absent.push_back(r);
    }
    return (absent.size() == 1 ? "rank " : "ranks ") + list_ranks(absent) + " of " +
           std::to_string(world_size) + " never arrived";
  };
  // A store that goes away mid-join (rank 0, its host, gave up) is reported with who was missing.
  auto present = [&](int r) {
    try {
      return store.check({join_key(r)});
    } catch (const std::exception& e) {
      TORCH_CHECK(false, prefix, "rendezvous failed: ", absent_ranks(),
                  " before the store went away: ", error_message(e));
    }
  };
  while (true) {
    for (int r = 0; r < world_size; ++r) {
      if (seen[r] || !present(r)) {
        continue;
      }
      const auto bytes = store.get(join_key(r));
      const std::string theirs(bytes.begin(), bytes.end());
      TORCH_CHECK(theirs == mine, prefix, "world size mismatch: rank ", rank,
                  " was started with WORLD_SIZE=", mine, " but rank ", r,
                  " with WORLD_SIZE=", theirs);
      seen[r] = true;
      --missing;
    }
    if (missing == 0) {
      return base;
    }
    TORCH_CHECK(Clock::now() < deadline, prefix, "rendezvous timed out after ", timeout.count(),
                " ms: ", absent_ranks());
    std::this_thread::sleep_for(kJoinPollInterval);
  }
}

namespace {

std::shared_ptr<ProcessGroup> make_backend(const c10::intrusive_ptr<c10d::Store>& group_store,
                                           int rank, int world_size,
                                           const ProcessGroupOptions& options) {
  if (options.backend == "gloo") {
    return make_gloo_process_group(group_store, rank, world_size, options);
  }
#ifdef FSDP_WITH_MPI
  if (options.backend == "mpi") {
    return make_mpi_process_group(group_store, rank, world_size, options);
  }
#endif
#ifdef FSDP_WITH_NCCL
  if (options.backend == "nccl") {
    return make_nccl_process_group(group_store, rank, world_size, options);
  }
#endif
  std::string names;
  for (const auto& name : available_backends()) names += (names.empty() ? "" : ", ") + name;
  TORCH_CHECK(false, "fsdp: backend '", options.backend, "' is not in this build; it has: ", names);
}

}  // namespace

std::shared_ptr<ProcessGroup> make_backend_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                 int rank, int world_size,
                                                 const ProcessGroupOptions& options) {
  const std::string base = join_ranks(*store, rank, world_size, options.timeout);
  auto group_store = c10::make_intrusive<c10d::PrefixStore>(base + options.backend, store);
  auto flight_store = c10::make_intrusive<c10d::PrefixStore>(base + "flight", store);
  return make_recording_group(make_backend(group_store, rank, world_size, options),
                              std::move(flight_store), "world", options);
}

c10::intrusive_ptr<c10d::Store> join_subgroup(const c10::intrusive_ptr<c10d::Store>& parent,
                                              const std::string& name, int index, int size,
                                              const std::string& backend,
                                              std::chrono::milliseconds timeout) {
  auto store = c10::make_intrusive<c10d::PrefixStore>("split/" + name, parent);
  const std::string base = join_ranks(*store, index, size, timeout);
  return c10::make_intrusive<c10d::PrefixStore>(base + backend, store);
}

void resolve_master(LaunchEnv& env) {
  if (!env.master_from_mpi) return;
#ifdef FSDP_WITH_MPI
  share_master_over_mpi(env);
  env.master_from_mpi = false;
#else
  TORCH_CHECK(false,
              "fsdp: this launch leaves the master's address to MPI, but this build has "
              "no MPI; pass it, e.g. mpirun -x MASTER_ADDR=<rank 0's host> -x MASTER_PORT=29500");
#endif
}

}  // namespace detail

std::vector<std::string> available_backends() {
  std::vector<std::string> names{"gloo"};
#ifdef FSDP_WITH_MPI
  names.push_back("mpi");
#endif
#ifdef FSDP_WITH_NCCL
  names.push_back("nccl");
#endif
  return names;
}

std::string default_backend(const LaunchEnv& env) {
#ifdef FSDP_WITH_MPI
  if (env.launched_by_mpirun) return "mpi";
#endif
  (void)env;
  return "gloo";
}

}  // namespace fsdp
