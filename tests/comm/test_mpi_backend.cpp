// The mpi backend against the gloo backend and against a float64 sum, run as one rank of an
// mpirun job (ctest starts it with mpirun -np 4, once per FSDP_MPI_ALGO; see tests/CMakeLists.txt).
// Every rank runs every test in the same order, so their collectives match.
//
// Both backends' groups are made in this process over the same launch: the rendezvous store's
// address comes over MPI, as it does for fsdp-train under mpirun. Groups of W = 1..4 are the
// first W ranks of the world, split from it on both backends (mpi_test_groups.h).
#include "comm/mpi_test_groups.h"

#include <support/test_support.h>

#include <fsdp/comm/process_group.h>
#include <fsdp/comm/rendezvous.h>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace fsdp {
namespace {

using test_mpi::expect_close_to;
using test_mpi::first_ranks;
using test_mpi::Groups;
using test_mpi::input_of;
using test_mpi::sum_in_double;
using test_mpi::tolerance;
using test_mpi::world;
using ::testing::HasSubstr;

const std::vector<at::ScalarType> kDtypes = {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf};

// A program that names no backend gets the launch's: under mpirun, the mpi backend, not gloo's
// TCP path ([Note: the default backend follows the launch]).
TEST(MpiBackend, AGroupWithoutANamedBackendUnderMpirunIsMpi) {
  EXPECT_EQ(world().mpi->backend_name(), "mpi");
  EXPECT_EQ(default_backend(launch_env_from_environment()), "mpi");
}

TEST(MpiBackend, WorldIsTheMpirunJobOnBothBackends) {
  const Groups& g = world();
  EXPECT_EQ(g.mpi->backend_name(), "mpi");
  EXPECT_EQ(g.gloo->backend_name(), "gloo");
  EXPECT_EQ(g.mpi->size(), g.gloo->size());
  EXPECT_EQ(g.mpi->rank(), g.gloo->rank());
  EXPECT_GE(g.mpi->size(), 2) << "run under mpirun -np 2 or more";
}

// Reduce-scatter and all-reduce, every dtype and op, at every W: within one rounding per
// addition of the float64 sum, and bit for bit gloo's result at W <= 2, where both add the same
// two numbers once. kAvg's division by W = 1, 2, 4 is exact, so it agrees too.
TEST(MpiBackend, ReductionsMatchTheExactSumAndGloo) {
  const int64_t per_rank = 1031;  // odd: no rank's chunk is aligned to anything
  for (int w = 1; w <= world().mpi->size(); ++w) {
    const Groups g = first_ranks(w);
    if (!g.mpi) continue;
    const int r = g.mpi->rank();
    for (const auto dtype : kDtypes) {
      for (const auto op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        const uint64_t seed = 17 * w + static_cast<int>(dtype) * 3 + static_cast<int>(op);
        const std::string what = "W=" + std::to_string(w) + " " + c10::toString(dtype) +
                                 (op == ReduceOp::kSum ? " sum" : " avg");
        at::Tensor want = sum_in_double(w, per_rank * w, dtype, seed);
        if (op == ReduceOp::kAvg) want /= w;
        const at::Tensor in = input_of(r, per_rank * w, dtype, seed);

        at::Tensor rs_mpi = at::empty({per_rank}, dtype);
        at::Tensor rs_gloo = at::empty({per_rank}, dtype);
        g.mpi->reduce_scatter_tensor(rs_mpi, in, op)->wait();
        g.gloo->reduce_scatter_tensor(rs_gloo, in, op)->wait();
        expect_close_to(rs_mpi, want.narrow(0, r * per_rank, per_rank), tolerance(dtype, w),
                        "reduce-scatter " + what);

        at::Tensor ar_mpi = in.clone();
        at::Tensor ar_gloo = in.clone();
        g.mpi->all_reduce(ar_mpi, op)->wait();
        g.gloo->all_reduce(ar_gloo, op)->wait();
        expect_close_to(ar_mpi, want, tolerance(dtype, w), "all-reduce " + what);
        if (w <= 2) {
          EXPECT_TRUE(at::equal(rs_mpi, rs_gloo)) << "reduce-scatter " << what;
          EXPECT_TRUE(at::equal(ar_mpi, ar_gloo)) << "all-reduce " << what;
        }
      }
    }
  }
}

TEST(MpiBackend, AllGatherAndBroadcastMoveEveryDtypeExactly) {
  for (int w = 1; w <= world().mpi->size(); ++w) {
    const Groups g = first_ranks(w);
    if (!g.mpi) continue;
    const int r = g.mpi->rank();
    // int8: the values of Int8AllGather (qwZ).
    for (const auto dtype :
         {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf, at::kLong, at::kChar}) {
      const std::string what = "W=" + std::to_string(w) + " " + c10::toString(dtype);
      const int64_t n = 517;
      std::vector<at::Tensor> all;
      for (int q = 0; q < w; ++q) all.push_back(input_of(q, n, dtype, 5 + w));
      at::Tensor gathered = at::empty({w * n}, dtype);
      g.mpi->all_gather_into_tensor(gathered, all[r])->wait();
      EXPECT_TRUE(at::equal(gathered, at::cat(all))) << "all-gather " << what;

      const int root = w - 1;
      at::Tensor mine = r == root ? all[root].clone() : at::zeros({n}, dtype);
      g.mpi->broadcast(mine, root)->wait();
      EXPECT_TRUE(at::equal(mine, all[root])) << "broadcast " << what;
    }
  }
}

// Reduce to the last rank of every group: the exact sum there, gloo's bits at W <= 2, and the
// other ranks' tensors untouched.
TEST(MpiBackend, ReduceMatchesTheExactSumAndGloo) {
  for (int w = 1; w <= world().mpi->size(); ++w) {
    const Groups g = first_ranks(w);
    if (!g.mpi) continue;
    const int r = g.mpi->rank();
    const int root = w - 1;
    for (const auto dtype : kDtypes) {
      const std::string what = "W=" + std::to_string(w) + " " + c10::toString(dtype);
      const uint64_t seed = 91 + w + static_cast<int>(dtype);
      const at::Tensor in = input_of(r, 333, dtype, seed);
      at::Tensor by_mpi = in.clone(), by_gloo = in.clone();
      g.mpi->reduce(by_mpi, root, ReduceOp::kSum)->wait();
      g.gloo->reduce(by_gloo, root, ReduceOp::kSum)->wait();
      if (r != root) {
        EXPECT_TRUE(at::equal(by_mpi, in)) << "reduce changed a non-root's tensor, " << what;
        continue;
      }
      expect_close_to(by_mpi, sum_in_double(w, 333, dtype, seed), tolerance(dtype, w),
                      "reduce " + what);
      if (w <= 2) EXPECT_TRUE(at::equal(by_mpi, by_gloo)) << "reduce " << what;
    }
  }
}

TEST(MpiBackend, IntegerAllReduceIsExact) {
  const Groups& g = world();
  at::Tensor t = at::arange(100, at::kLong) * (g.mpi->rank() + 1);
  g.mpi->all_reduce(t, ReduceOp::kSum)->wait();
  const int64_t w = g.mpi->size();
  EXPECT_TRUE(at::equal(t, at::arange(100, at::kLong) * (w * (w + 1) / 2)));
}

// The two halves of the world (HSDP's replicas, hpZ's groups) reduce independently, at once.
TEST(MpiBackend, SplitGroupsReduceIndependently) {
  const Groups& g = world();
  const int w = g.mpi->size();
  std::vector<int> evens, odds;
  for (int r = 0; r < w; ++r) (r % 2 == 0 ? evens : odds).push_back(r);
  auto even = g.mpi->split(evens, "evens");
  auto odd = g.mpi->split(odds, "odds");
  auto& mine = g.mpi->rank() % 2 == 0 ? even : odd;
  ASSERT_TRUE(mine);
  EXPECT_FALSE(g.mpi->rank() % 2 == 0 ? odd : even);
  at::Tensor t = at::full({8}, static_cast<double>(g.mpi->rank()), at::kDouble);
  mine->all_reduce(t, ReduceOp::kSum)->wait();
  double want = 0;
  for (int r = g.mpi->rank() % 2; r < w; r += 2) want += r;
  EXPECT_TRUE(at::equal(t, at::full({8}, want, at::kDouble)));
}

// Both backends count bytes the same way: the fsdp-train metrics and the estimator's checks
// hold whichever moved them.
TEST(MpiBackend, CountsBytesAsGlooDoes) {
  const Groups& g = world();
  const int w = g.mpi->size();
  for (auto* group : {g.mpi.get(), g.gloo.get()}) {
    group->reset_counters();
    at::Tensor in = at::ones({64 * w}, at::kFloat);
    at::Tensor out = at::empty({64}, at::kFloat);
    group->reduce_scatter_tensor(out, in, ReduceOp::kSum)->wait();
    at::Tensor gathered = at::empty({64 * w}, at::kFloat);
    group->all_gather_into_tensor(gathered, out)->wait();
    group->all_reduce(out, ReduceOp::kAvg)->wait();
    group->broadcast(out, 0)->wait();
  }
  const CommCounters a = g.mpi->counters();
  const CommCounters b = g.gloo->counters();
  for (auto [x, y] :
       {std::pair{a.all_gather, b.all_gather}, std::pair{a.reduce_scatter, b.reduce_scatter},
        std::pair{a.all_reduce, b.all_reduce}, std::pair{a.broadcast, b.broadcast}}) {
    EXPECT_EQ(x.calls, y.calls);
    EXPECT_EQ(x.payload_bytes, y.payload_bytes);
    EXPECT_EQ(x.sent_bytes, y.sent_bytes);
  }
  EXPECT_EQ(a.reduce_scatter.sent_bytes, 64 * 4 * (w - 1));
}

TEST(MpiBackend, MisuseThrowsNamingTheBackend) {
  const Groups& g = world();
  at::Tensor in = at::ones({10}, at::kInt);
  at::Tensor out = at::empty({10 / 1}, at::kInt);
  EXPECT_THAT(test::error_message([&] { g.mpi->reduce_scatter_tensor(out, in, ReduceOp::kSum); }),
              HasSubstr("the mpi backend reduces Float, Double, BFloat16 and Half, got Int"));
  at::Tensor strided = at::ones({4, 4}).t();
  EXPECT_THAT(test::error_message([&] { g.mpi->all_reduce(strided, ReduceOp::kSum); }),
              HasSubstr("must be contiguous"));
}

}  // namespace
}  // namespace fsdp
