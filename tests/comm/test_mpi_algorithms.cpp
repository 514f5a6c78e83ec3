// The mpi backend's algorithm by message size (src/comm/mpi/mpi_algorithm.h): Open MPI's own
// non-blocking collectives below a threshold, our ring (mpi_ring.h) from it, for the all-gather,
// reduce-scatter, all-reduce, broadcast and reduce. Each collective runs
// just below and just above its threshold, at W = 2, 3 and 4, against references that involve no
// MPI: the float64 sum, and the gloo backend's results. Part of test_mpi_backend's binary, which
// ctest runs under mpirun once per FSDP_MPI_ALGO (auto, ring, native), so every size also runs
// under each algorithm.
#include "comm/mpi/mpi_algorithm.h"
#include "comm/mpi_test_groups.h"

#include <fsdp/comm/process_group.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace fsdp {
namespace {

using detail::MpiAlgorithm;
using detail::MpiRingCollective;
using test_mpi::expect_close_to;
using test_mpi::first_ranks;
using test_mpi::Groups;
using test_mpi::input_of;
using test_mpi::sum_in_double;
using test_mpi::tolerance;
using test_mpi::world;

bool is_ring(MpiRingCollective collective, const at::Tensor& larger, int w) {
  return detail::mpi_algorithm_for(collective, static_cast<int64_t>(larger.nbytes()), w) ==
         MpiAlgorithm::kRing;
}

// Element counts of the larger buffer, multiples of w: one just below collective's threshold,
// one just above it, and one of 196,613 elements per rank (768 KiB in fp32: three of the ring's
// 256 KiB segments and a tail), odd per rank, so that no chunk or segment is aligned.
std::vector<int64_t> counts_around_threshold(MpiRingCollective collective, int w,
                                             at::ScalarType dtype) {
  const int64_t from = detail::mpi_ring_from_bytes(collective, w) /
                       static_cast<int64_t>(c10::elementSize(dtype)) / w;
  return {w * (from - 1), w * (from + 3), w * int64_t{196613}};
}

std::string name_of(int w, at::ScalarType dtype, ReduceOp op, int64_t n) {
  return "W=" + std::to_string(w) + " " + c10::toString(dtype) +
         (op == ReduceOp::kSum ? " sum " : " avg ") + std::to_string(n) + " elements";
}

// Every rank's copy of t, gathered over gloo, is rank 0's bit for bit.
void expect_same_on_every_rank(const Groups& g, const at::Tensor& t, const std::string& what) {
  const int w = g.gloo->size();
  at::Tensor all = at::empty({w * t.numel()}, t.options());
  g.gloo->all_gather_into_tensor(all, t)->wait();
  for (int q = 1; q < w; ++q) {
    EXPECT_TRUE(at::equal(all.narrow(0, q * t.numel(), t.numel()), all.narrow(0, 0, t.numel())))
        << what << ": rank " << q << " differs from rank 0";
  }
}

// Within one rounding per addition of the float64 sum; the ring is the gloo backend's ring bit
// for bit at every W (the same order of additions, the same roundings), the native algorithm
// at W = 2, where both add the same two numbers once.
TEST(MpiAlgorithm, ReduceScatterAroundItsThresholdIsGloosRing) {
  for (int w = 2; w <= world().mpi->size(); ++w) {
    const Groups g = first_ranks(w);
    if (!g.mpi) continue;
    for (const auto dtype : {at::kFloat, at::kBFloat16}) {
      for (const auto op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        for (const int64_t n :
             counts_around_threshold(MpiRingCollective::kReduceScatter, w, dtype)) {
          const uint64_t seed = 7 * w + static_cast<int>(dtype) + static_cast<int>(op) + n % 5;
          const std::string what = "reduce-scatter " + name_of(w, dtype, op, n);
          const at::Tensor in = input_of(g.mpi->rank(), n, dtype, seed);
          at::Tensor by_mpi = at::empty({n / w}, dtype);
          at::Tensor by_gloo = at::empty({n / w}, dtype);
          g.mpi->reduce_scatter_tensor(by_mpi, in, op)->wait();
          g.gloo->reduce_scatter_tensor(by_gloo, in, op)->wait();
          at::Tensor want = sum_in_double(w, n, dtype, seed).chunk(w)[g.mpi->rank()];
          if (op == ReduceOp::kAvg) want /= w;
          expect_close_to(by_mpi, want, tolerance(dtype, w), what);
          if (is_ring(MpiRingCollective::kReduceScatter, in, w) || w == 2) {
            EXPECT_TRUE(at::equal(by_mpi, by_gloo)) << what;
          }
        }
      }
    }
  }
}

// n elements: the multiples of W of counts_around_threshold, one more than the largest (the
// ring's chunks uneven) and W - 1 (one chunk empty). For the ring at a multiple of W the reference
// for the bits is gloo's reduce-scatter (the ring's own order of additions) then its all-gather.
TEST(MpiAlgorithm, AllReduceAroundItsThresholdIsTheSameOnEveryRank) {
  for (int w = 2; w <= world().mpi->size(); ++w) {
    const Groups g = first_ranks(w);
    if (!g.mpi) continue;
    for (const auto dtype : {at::kFloat, at::kBFloat16, at::kLong}) {
      for (const auto op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        if (op == ReduceOp::kAvg && dtype == at::kLong) continue;
        auto counts = counts_around_threshold(MpiRingCollective::kAllReduce, w, dtype);
        counts.push_back(counts.back() + 1);
        counts.push_back(w - 1);
        for (const int64_t n : counts) {
          const uint64_t seed = 11 * w + static_cast<int>(dtype) + static_cast<int>(op) + n % 7;
          const std::string what = "all-reduce " + name_of(w, dtype, op, n);
          const at::Tensor in = input_of(g.mpi->rank(), n, dtype, seed);
          at::Tensor by_mpi = in.clone();
          g.mpi->all_reduce(by_mpi, op)->wait();
          at::Tensor want = sum_in_double(w, n, dtype, seed);
          if (op == ReduceOp::kAvg) want /= w;
          if (dtype == at::kLong) {
            EXPECT_TRUE(at::equal(by_mpi, want.to(at::kLong))) << what;
          } else {
            expect_close_to(by_mpi, want, tolerance(dtype, w), what);
          }
          expect_same_on_every_rank(g, by_mpi, what);
          // gloo's reduce-scatter sums floating point types only.
          if (!is_ring(MpiRingCollective::kAllReduce, in, w) || n % w != 0 || dtype == at::kLong) {
            continue;
          }
          at::Tensor chunk = at::empty({n / w}, dtype);
          at::Tensor by_gloo = at::empty({n}, dtype);
          g.gloo->reduce_scatter_tensor(chunk, in, op)->wait();
          g.gloo->all_gather_into_tensor(by_gloo, chunk)->wait();
          EXPECT_TRUE(at::equal(by_mpi, by_gloo)) << what;
        }
      }
    }
  }
}

TEST(MpiAlgorithm, AllGatherAroundItsThresholdMovesEveryByte) {
  for (int w = 2; w <= world().mpi->size(); ++w) {
    const Groups g = first_ranks(w);
    if (!g.mpi) continue;
    for (const auto dtype : {at::kFloat, at::kBFloat16, at::kChar}) {
      for (const int64_t n : counts_around_threshold(MpiRingCollective::kAllGather, w, dtype)) {
        std::vector<at::Tensor> inputs;
        for (int q = 0; q < w; ++q) inputs.push_back(input_of(q, n / w, dtype, 3 * w + n % 11));
        at::Tensor gathered = at::empty({n}, dtype);
        g.mpi->all_gather_into_tensor(gathered, inputs[g.mpi->rank()])->wait();
        EXPECT_TRUE(at::equal(gathered, at::cat(inputs)))
            << "all-gather " << name_of(w, dtype, ReduceOp::kSum, n);
      }
    }
  }
}

// From rank 0 and from the last rank (whose chain wraps around): every rank ends with root's bytes;
// the counts are those of the all-gather's test, plus one below a segment and an empty tensor.
TEST(MpiAlgorithm, BroadcastAroundItsThresholdFromTheFirstAndLastRoot) {
  for (int w = 2; w <= world().mpi->size(); ++w) {
    const Groups g = first_ranks(w);
    if (!g.mpi) continue;
    for (const auto dtype : {at::kFloat, at::kBFloat16, at::kChar}) {
      auto counts = counts_around_threshold(MpiRingCollective::kBroadcast, w, dtype);
      counts.push_back(1000);
      counts.push_back(0);
      for (const int64_t n : counts) {
        for (const int root : {0, w - 1}) {
          const uint64_t seed = 13 * w + root + n % 11;
          const at::Tensor want = input_of(root, n, dtype, seed);
          at::Tensor t = g.mpi->rank() == root ? want.clone() : at::zeros({n}, dtype);
          g.mpi->broadcast(t, root)->wait();
          EXPECT_TRUE(at::equal(t, want))
              << "broadcast from root " << root << " " << name_of(w, dtype, ReduceOp::kSum, n);
        }
      }
    }
  }
}

// root gets the sum within one rounding per addition of the float64 sum; as a ring, the bits of
// the all-reduce of the same size (the same reduce-scatter); the other ranks' tensors are not
// written by either algorithm. n as in the all-reduce's test.
TEST(MpiAlgorithm, ReduceAroundItsThresholdToTheFirstAndLastRoot) {
  for (int w = 2; w <= world().mpi->size(); ++w) {
    const Groups g = first_ranks(w);
    if (!g.mpi) continue;
    for (const auto dtype : {at::kFloat, at::kBFloat16}) {
      for (const auto op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        auto counts = counts_around_threshold(MpiRingCollective::kReduce, w, dtype);
        counts.push_back(counts.back() + 1);
        counts.push_back(w - 1);
        for (const int64_t n : counts) {
          for (const int root : {0, w - 1}) {
            const uint64_t seed = 17 * w + root + static_cast<int>(op) + n % 7;
            const std::string what =
                "reduce to root " + std::to_string(root) + " " + name_of(w, dtype, op, n);
            const at::Tensor in = input_of(g.mpi->rank(), n, dtype, seed);
            at::Tensor by_reduce = in.clone();
            at::Tensor by_all_reduce = in.clone();
            g.mpi->reduce(by_reduce, root, op)->wait();
            g.mpi->all_reduce(by_all_reduce, op)->wait();
            if (g.mpi->rank() != root) {
              EXPECT_TRUE(at::equal(by_reduce, in)) << what << ": a non-root tensor was written";
              continue;
            }
            at::Tensor want = sum_in_double(w, n, dtype, seed);
            if (op == ReduceOp::kAvg) want /= w;
            expect_close_to(by_reduce, want, tolerance(dtype, w), what);
            if (is_ring(MpiRingCollective::kReduce, in, w) &&
                is_ring(MpiRingCollective::kAllReduce, in, w)) {
              EXPECT_TRUE(at::equal(by_reduce, by_all_reduce)) << what;
            }
          }
        }
      }
    }
  }
}

// The threshold splits the sizes under auto; ring and native take every size.
TEST(MpiAlgorithm, TheChoiceFollowsTheSizeUnlessTheEnvironmentNamesOne) {
  const char* value = std::getenv("FSDP_MPI_ALGO");
  const std::string policy = value ? value : "auto";
  for (const auto c :
       {MpiRingCollective::kAllGather, MpiRingCollective::kReduceScatter,
        MpiRingCollective::kAllReduce, MpiRingCollective::kBroadcast, MpiRingCollective::kReduce}) {
    for (int w = 2; w <= 4; ++w) {
      const int64_t from = detail::mpi_ring_from_bytes(c, w);
      const MpiAlgorithm below = detail::mpi_algorithm_for(c, from - 1, w);
      const MpiAlgorithm at = detail::mpi_algorithm_for(c, from, w);
      EXPECT_EQ(below, policy == "ring" ? MpiAlgorithm::kRing : MpiAlgorithm::kNative) << policy;
      EXPECT_EQ(at, policy == "native" ? MpiAlgorithm::kNative : MpiAlgorithm::kRing) << policy;
    }
  }
}

}  // namespace
}  // namespace fsdp
