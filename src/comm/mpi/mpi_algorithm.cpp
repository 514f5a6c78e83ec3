// The choice between Open MPI's non-blocking collectives and our rings (see mpi_algorithm.h).
//
// The choice depends only on numbers every rank of a call shares (the collective, its size, the
// group's size) and on FSDP_MPI_ALGO, which must be the same on every rank, as mpirun passes its
// environment to all of them: ranks that chose differently would post messages the others never
// match, and the op would time out.
#include "mpi_algorithm.h"
#include "mpi_environment.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <string>

namespace fsdp::detail {
namespace {

// [Note: MPI algorithm by message size]
// Open MPI 4.1's non-blocking collectives (libnbc) win on latency: 4-12 us for 1-4 KiB at W = 2
// against 7-15 us for our ring, which posts a send and a receive per step and waits for both.
// From tens of KiB up libnbc loses: it copies every byte through vader's shared-memory
// fragments (two copies, and its reduce adds fragment by fragment), while the ring's receiver
// copies once, straight from the sender (CMA), and adds in cache ([Note: ring segments]). At
// 16-256 MiB libnbc's all-reduce and reduce-scatter took 1.1-4.6x gloo's time, the ring
// 0.6-1.3x. Measured with bench/comm_backends.sh (MPI_ALGOS="native ring"), W = 2 on this
// 2-core machine under load 7-10, two runs (bench/RESULTS.md, "MPI at every size"):
// - reduce-scatter: the ring is faster from 64 KiB (15-16 us against 24-25 us; at 16 KiB each
//   won one run), so the ring from 64 KiB;
// - all-reduce: the ring is faster from 256 KiB in both runs (67-73 us against 85-91 us; at
//   64 KiB each won one run), so the ring from 256 KiB;
// - all-gather: libnbc's is already 2-20x faster than gloo's at every size on one host, and the
//   ring was within the noise of it from 256 KiB up. The ring from 1 MiB is a bet on all-gathers
//   between hosts, where libnbc's took 1.1-2.2x gloo's time at 1-16 MiB on the 1g link and the
//   ring 0.6-1.1x (bench/RESULTS.md, "Over the shaped link (1g)": one run).
// - reduce: the ring (ring_reduce: the all-reduce's reduce-scatter, then each chunk to root)
//   takes half libnbc's time on one host from 256 KiB (56 against 85 us; 124 against 256 ms at
//   256 MiB), libnbc wins below; so the ring from 256 KiB. Over the 1g link both stay within
//   gloo's time at every size, libnbc closer to the wire from 16 MiB (0.63-0.73 of gloo's time
//   against the ring's 0.87-0.94);
// - broadcast: the ring (a pipeline down the chain from root) and libnbc take the same time on
//   one host idle and over the link at every size (both at the wire's speed over it), but under
//   load libnbc's large broadcasts took 1.3-2x gloo's time on one host and its posted-at-once
//   segments are what survive load ([Note: ring segments]); so the ring from 1 MiB.
// (bench/RESULTS.md, "MPI at every size, second part": an idle machine, W = 2.)
// The same thresholds at every W: measured at W = 2 only (W = 4 means four ranks on two cores).
constexpr int64_t kRingAllGatherFromBytes = int64_t{1} << 20;
constexpr int64_t kRingReduceScatterFromBytes = int64_t{64} << 10;
constexpr int64_t kRingAllReduceFromBytes = int64_t{256} << 10;
constexpr int64_t kRingBroadcastFromBytes = int64_t{1} << 20;
constexpr int64_t kRingReduceFromBytes = int64_t{256} << 10;

enum class Policy { kAuto, kNative, kRing };

Policy policy_from_environment() {
  static const Policy policy = choice_from_environment<Policy>(
      "FSDP_MPI_ALGO", "an MPI algorithm choice",
      {{"auto", Policy::kAuto}, {"native", Policy::kNative}, {"ring", Policy::kRing}});
  return policy;
}

}  // namespace

MpiAlgorithm mpi_algorithm_for(MpiRingCollective collective, int64_t bytes, int world_size) {
  switch (policy_from_environment()) {
    case Policy::kNative:
      return MpiAlgorithm::kNative;
    case Policy::kRing:
      return MpiAlgorithm::kRing;
    case Policy::kAuto:
      break;
  }
  return bytes >= mpi_ring_from_bytes(collective, world_size) ? MpiAlgorithm::kRing
                                                              : MpiAlgorithm::kNative;
}

int64_t mpi_ring_from_bytes(MpiRingCollective collective, int world_size) {
  (void)world_size;
  switch (collective) {
    case MpiRingCollective::kAllGather:
      return kRingAllGatherFromBytes;
    case MpiRingCollective::kReduceScatter:
      return kRingReduceScatterFromBytes;
    case MpiRingCollective::kAllReduce:
      return kRingAllReduceFromBytes;
    case MpiRingCollective::kBroadcast:
      return kRingBroadcastFromBytes;
    case MpiRingCollective::kReduce:
      return kRingReduceFromBytes;
  }
  TORCH_INTERNAL_ASSERT(false, "unknown collective");
}

}  // namespace fsdp::detail
