// Private to src/comm: how a group of ranks forms over a key-value store, below any backend.
//
// join_ranks is the join protocol every backend's group starts with (see bootstrap.cpp); the
// backend then connects its own transport under the returned key prefix. make_backend_group
// is the backend factory: it maps ProcessGroupOptions::backend to the backends this build has
// (chosen by CMake: FSDP_WITH_MPI, FSDP_WITH_NCCL), so rendezvous never names a backend and a
// backend never calls back into rendezvous.
#pragma once

#include <fsdp/comm/process_group.h>
#include <fsdp/comm/rendezvous.h>

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace fsdp {

// What RendezvousStore wraps: a c10d store, kept out of the public header.
struct RendezvousStore::Impl {
  c10::intrusive_ptr<c10d::Store> store;
};

namespace detail {

// Waits until all world_size ranks announced themselves on store, checking that they agree on
// world_size. Returns the key prefix private to this group ("fsdp/<generation>/"). Throws
// naming the missing ranks after timeout, or both values on a world-size mismatch.
std::string join_ranks(c10d::Store& store, int rank, int world_size,
                       std::chrono::milliseconds timeout);

// A subgroup's members meet: each calls this with its index in the subgroup, over the parent
// group's store, and gets the store private to the subgroup's backend (the parent's keys under
// "split/<name>/", then join_ranks' prefix and the backend's name). Throws as join_ranks does.
c10::intrusive_ptr<c10d::Store> join_subgroup(const c10::intrusive_ptr<c10d::Store>& parent,
                                              const std::string& name, int index, int size,
                                              const std::string& backend,
                                              std::chrono::milliseconds timeout);

// The group of options.backend for this rank, connected over store (private to this group).
// Throws listing the backends of this build when options.backend is not one of them.
std::shared_ptr<ProcessGroup> make_backend_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                 int rank, int world_size,
                                                 const ProcessGroupOptions& options);

// Fills in the master of a launch that left it to MPI (env.master_from_mpi); a no-op
// otherwise. Throws when this build has no MPI.
void resolve_master(LaunchEnv& env);

}  // namespace detail
}  // namespace fsdp
