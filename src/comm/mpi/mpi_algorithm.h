// Private to src/comm/mpi: which algorithm carries a collective of a given size, Open MPI's own
// non-blocking collective or our ring over point-to-point messages (mpi_ring.h). See [Note: MPI
// algorithm by message size] in mpi_algorithm.cpp for the measurements behind the thresholds.
#pragma once

#include <cstdint>

namespace fsdp::detail {

enum class MpiAlgorithm {
  kNative,  // MPI_Iallgather, MPI_Ireduce_scatter_block, MPI_Iallreduce, ... (Open MPI's libnbc)
  kRing,    // mpi_ring.h
};

// The collectives that have a ring; the barrier is always native.
enum class MpiRingCollective { kAllGather, kReduceScatter, kAllReduce, kBroadcast, kReduce };

// The algorithm for collective when its larger buffer (the all-gather's output, the
// reduce-scatter's input, the tensor of the others) holds bytes bytes, in a group of world_size
// ranks. The same on every rank for the same call, since every rank passes the same numbers.
// FSDP_MPI_ALGO overrides the choice for benchmarking: auto (the default: by size), native or
// ring (every size); any other value throws, naming the choices.
MpiAlgorithm mpi_algorithm_for(MpiRingCollective collective, int64_t bytes, int world_size);

// The smallest size, in bytes of the larger buffer, from which FSDP_MPI_ALGO=auto (the default)
// runs collective as a ring in a group of world_size ranks.
int64_t mpi_ring_from_bytes(MpiRingCollective collective, int world_size);

}  // namespace fsdp::detail
