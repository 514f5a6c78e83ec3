// The gloo ProcessGroup, with ranks as threads. Every collective is checked against a result
// computed locally from all ranks' inputs (each rank can rebuild any rank's input from its
// index), so the tests do not trust one collective to check another.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <fsdp/comm/process_group.h>
#include <fsdp/comm/rendezvous.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "support/test_support.h"

namespace fsdp {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Distinct, non-trivial data for each rank; any rank can rebuild any other rank's input.
at::Tensor rank_input(int rank, int64_t numel, at::ScalarType dtype = at::kFloat) {
  auto x = at::arange(numel, at::kDouble);
  return (at::sin(x * (0.37 * (rank + 1))) * (rank + 1) + 0.25 * rank).to(dtype);
}

TEST(ProcessGroupTest, ReportsRankSizeAndBackend) {
  run_ranks_in_threads(
      3,
      [](std::shared_ptr<ProcessGroup> pg) {
        EXPECT_EQ(pg->size(), 3);
        EXPECT_GE(pg->rank(), 0);
        EXPECT_LT(pg->rank(), 3);
        EXPECT_EQ(pg->backend_name(), "gloo");
        EXPECT_TRUE(pg->device().is_cpu());
      },
      test::test_options());
}

TEST(ProcessGroupTest, AllGatherPutsEveryRanksInputInRankOrder) {
  for (int world = 1; world <= 4; ++world) {
    SCOPED_TRACE("world size " + std::to_string(world));
    run_ranks_in_threads(
        world,
        [world](std::shared_ptr<ProcessGroup> pg) {
          const int64_t n = 7;
          auto input = rank_input(pg->rank(), n);
          auto output = at::full({world, n}, -1.0f);
          pg->all_gather_into_tensor(output, input)->wait();
          for (int r = 0; r < world; ++r) {
            EXPECT_TRUE(at::equal(output[r], rank_input(r, n))) << "chunk " << r;
          }
          // Integers travel bit-exactly too.
          auto ints = at::arange(3, at::kLong) + 10 * pg->rank();
          auto gathered = at::empty({3 * world}, at::kLong);
          pg->all_gather_into_tensor(gathered, ints)->wait();
          for (int r = 0; r < world; ++r) {
            EXPECT_TRUE(at::equal(gathered.narrow(0, 3 * r, 3), at::arange(3, at::kLong) + 10 * r));
          }
        },
        test::test_options());
  }
}

// From 64 KiB of output the gloo backend gathers with a ring of its own (src/comm/gloo): every
// dtype bit for bit, into a fresh output or in place (the input a view of this rank's chunk).
TEST(ProcessGroupTest, LargeAllGatherPutsEveryRanksInputInRankOrder) {
  for (int world = 2; world <= 4; ++world) {
    SCOPED_TRACE("world size " + std::to_string(world));
    run_ranks_in_threads(
        world,
        [world](std::shared_ptr<ProcessGroup> pg) {
          const int64_t n = 3 * 65536 + 5;  // odd, and over the threshold at every W
          for (auto dtype : {at::kFloat, at::kBFloat16, at::kLong}) {
            SCOPED_TRACE(c10::toString(dtype));
            auto chunk_of = [&](int r) { return (rank_input(r, n, at::kDouble) * 1000).to(dtype); };
            auto output = at::full({world * n}, -1, dtype);
            pg->all_gather_into_tensor(output, chunk_of(pg->rank()))->wait();
            auto in_place = at::full({world * n}, -1, dtype);
            at::Tensor own = in_place.narrow(0, pg->rank() * n, n);
            own.copy_(chunk_of(pg->rank()));
            pg->all_gather_into_tensor(in_place, own)->wait();
            for (int r = 0; r < world; ++r) {
              EXPECT_TRUE(at::equal(output.narrow(0, r * n, n), chunk_of(r))) << "chunk " << r;
              EXPECT_TRUE(at::equal(in_place.narrow(0, r * n, n), chunk_of(r)))
                  << "in place, chunk " << r;
            }
          }
        },
        test::test_options());
  }
}

// Sum of every rank's input, computed locally in double.
at::Tensor reference_sum(int world, int64_t numel) {
  auto sum = at::zeros({numel}, at::kDouble);
  for (int r = 0; r < world; ++r) {
    sum += rank_input(r, numel, at::kDouble);
  }
  return sum;
}

TEST(ProcessGroupTest, ReduceScatterSumAndAvgMatchLocalReference) {
  for (int world = 1; world <= 4; ++world) {
    for (int64_t chunk : {1, 3, 7, 1001}) {
      SCOPED_TRACE("world size " + std::to_string(world) + ", chunk " + std::to_string(chunk));
      run_ranks_in_threads(
          world,
          [world, chunk](std::shared_ptr<ProcessGroup> pg) {
            const int rank = pg->rank();
            const auto expected =
                reference_sum(world, world * chunk).narrow(0, rank * chunk, chunk);
            for (auto dtype : {at::kFloat, at::kDouble}) {
              const double tol = dtype == at::kFloat ? 1e-5 : 1e-12;
              auto input = rank_input(rank, world * chunk, dtype);
              const auto input_before = input.clone();
              auto output = at::full({chunk}, -7.0, dtype);
              pg->reduce_scatter_tensor(output, input, ReduceOp::kSum)->wait();
              EXPECT_TRUE(at::allclose(output.to(at::kDouble), expected, tol, tol))
                  << "sum, " << dtype << ": max error "
                  << (output.to(at::kDouble) - expected).abs().max().item<double>();
              EXPECT_TRUE(at::equal(input, input_before)) << "the caller's input was modified";

              pg->reduce_scatter_tensor(output, input, ReduceOp::kAvg)->wait();
              EXPECT_TRUE(at::allclose(output.to(at::kDouble), expected / world, tol, tol))
                  << "avg, " << dtype;
            }
          },
          test::test_options());
    }
  }
}

TEST(ProcessGroupTest, ReduceScatterTakesMultiDimensionalTensors) {
  run_ranks_in_threads(
      2,
      [](std::shared_ptr<ProcessGroup> pg) {
        auto input = rank_input(pg->rank(), 2 * 12).view({4, 6});
        auto output = at::empty({2, 6});
        pg->reduce_scatter_tensor(output, input, ReduceOp::kSum)->wait();
        auto expected = reference_sum(2, 24).narrow(0, 12 * pg->rank(), 12).view({2, 6});
        EXPECT_TRUE(at::allclose(output.to(at::kDouble), expected, 1e-5, 1e-5));
      },
      test::test_options());
}

TEST(ProcessGroupTest, ReduceScatterLowPrecisionWithinRoundingOfTheDtype) {
  const int world = 4;
  const int64_t chunk = 257;
  for (auto dtype : {at::kBFloat16, at::kHalf}) {
    SCOPED_TRACE(c10::toString(dtype));
    run_ranks_in_threads(
        world,
        [&](std::shared_ptr<ProcessGroup> pg) {
          // The reference starts from the same rounded inputs, so only the reduction's own rounding
          // (W-1 hops, each rounded once to dtype) separates the two.
          auto expected = at::zeros({world * chunk}, at::kDouble);
          for (int r = 0; r < world; ++r) {
            expected += rank_input(r, world * chunk, dtype).to(at::kDouble);
          }
          expected = expected.narrow(0, pg->rank() * chunk, chunk);
          auto input = rank_input(pg->rank(), world * chunk, dtype);
          auto output = at::empty({chunk}, dtype);
          pg->reduce_scatter_tensor(output, input, ReduceOp::kSum)->wait();
          // W-1 roundings (W-2 partial sums sent on, and the result), each within the dtype's unit
          // roundoff (bf16 2^-8, fp16 2^-11) of a value no larger than the largest sum.
          const double unit = dtype == at::kBFloat16 ? 1.0 / 256 : 1.0 / 2048;
          const double largest = expected.abs().max().item<double>();
          const double max_error = (output.to(at::kDouble) - expected).abs().max().item<double>();
          EXPECT_LE(max_error, (world - 1) * unit * largest);
          EXPECT_GT(largest, 1.0);  // Dropping one rank's input would miss by far more than that.
        },
        test::test_options());
  }
}

TEST(ProcessGroupTest, AllReduceSumAndAvg) {
  const int world = 3;
  run_ranks_in_threads(
      world,
      [](std::shared_ptr<ProcessGroup> pg) {
        auto expected = reference_sum(world, 11);
        auto tensor = rank_input(pg->rank(), 11, at::kDouble);
        pg->all_reduce(tensor, ReduceOp::kSum)->wait();
        EXPECT_TRUE(at::allclose(tensor, expected, 1e-12, 1e-12));
        tensor = rank_input(pg->rank(), 11, at::kDouble);
        pg->all_reduce(tensor, ReduceOp::kAvg)->wait();
        EXPECT_TRUE(at::allclose(tensor, expected / world, 1e-12, 1e-12));
        // bf16 too (small integers, so the sum is exact), as mixed-precision gradients use it.
        auto half = at::full({5}, pg->rank() + 1.0, at::kBFloat16);
        pg->all_reduce(half, ReduceOp::kSum)->wait();
        EXPECT_TRUE(at::equal(half, at::full({5}, 6.0, at::kBFloat16)));
      },
      test::test_options());
}

// From 64 KiB up, all_reduce is our ring ([Note: gloo's all-reduce as a ring of our own]): W = 3
// and 4 with element counts that do not divide by W (uneven chunks), every dtype the gradients
// use, sum and avg, against the local double reference; every rank must end with the same bits
// (each chunk is its owner's), checked by gathering the results.
TEST(ProcessGroupTest, LargeAllReduceIsTheSameSumOnEveryRank) {
  for (int world : {3, 4}) {
    SCOPED_TRACE("world size " + std::to_string(world));
    run_ranks_in_threads(
        world,
        [world](std::shared_ptr<ProcessGroup> pg) {
          const int64_t numel = 3 * 65536 + 1;  // 768 KiB of fp32, 384 KiB of bf16
          const at::Tensor expected = reference_sum(world, numel);
          for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16}) {
            for (auto op : {ReduceOp::kSum, ReduceOp::kAvg}) {
              SCOPED_TRACE(std::string(c10::toString(dtype)) +
                           (op == ReduceOp::kSum ? " sum" : " avg"));
              at::Tensor t = rank_input(pg->rank(), numel, dtype);
              at::Tensor want = expected / (op == ReduceOp::kAvg ? world : 1);
              if (dtype == at::kBFloat16) {  // from the same rounded inputs, W roundings
                want = at::zeros({numel}, at::kDouble);
                for (int r = 0; r < world; ++r) want += rank_input(r, numel, dtype).to(at::kDouble);
                if (op == ReduceOp::kAvg) want /= world;
              }
              pg->all_reduce(t, op)->wait();
              // bf16: W roundings (W - 1 hops and the average), each within 2^-8 of the largest.
              const double tol = dtype == at::kDouble ? 1e-12
                                 : dtype == at::kFloat
                                     ? 1e-5
                                     : world / 256.0 * want.abs().max().item<double>();
              const double error = (t.to(at::kDouble) - want).abs().max().item<double>();
              EXPECT_LE(error, tol);
              at::Tensor all = at::empty({world * numel}, dtype);
              pg->all_gather_into_tensor(all, t)->wait();
              for (int r = 0; r < world; ++r) {
                EXPECT_TRUE(at::equal(all.narrow(0, r * numel, numel), t)) << "rank " << r;
              }
            }
          }
        },
        test::test_options());
  }
}

TEST(ProcessGroupTest, BroadcastFromNonZeroRoot) {
  const int world = 3;
  const int root = 2;
  run_ranks_in_threads(
      world,
      [](std::shared_ptr<ProcessGroup> pg) {
        auto tensor = rank_input(pg->rank(), 9);
        pg->broadcast(tensor, root)->wait();
        EXPECT_TRUE(at::equal(tensor, rank_input(root, 9)));
      },
      test::test_options());
}

// Reduce to one root (inter-tensor ZeRO-3's gradient reduction): the root gets the sum or the
// average, every other rank keeps its input untouched, and only the others count bytes sent.
TEST(ProcessGroupTest, ReduceGivesTheRootTheSumAndLeavesTheOthers) {
  const int world = 3;
  const int root = 1;
  run_ranks_in_threads(
      world,
      [](std::shared_ptr<ProcessGroup> pg) {
        const auto expected = reference_sum(world, 13);
        for (const auto op : {ReduceOp::kSum, ReduceOp::kAvg}) {
          auto tensor = rank_input(pg->rank(), 13, at::kDouble);
          pg->reduce(tensor, root, op)->wait();
          if (pg->rank() == root) {
            const auto want = op == ReduceOp::kSum ? expected : expected / world;
            EXPECT_TRUE(at::allclose(tensor, want, 1e-12, 1e-12));
          } else {
            EXPECT_TRUE(at::equal(tensor, rank_input(pg->rank(), 13, at::kDouble)));
          }
        }
        const auto counters = pg->counters().reduce;
        EXPECT_EQ(counters.calls, 2);
        EXPECT_EQ(counters.payload_bytes, 2 * 13 * 8);
        EXPECT_EQ(counters.sent_bytes, pg->rank() == root ? 0 : 2 * 13 * 8);
        EXPECT_THAT(test::error_message([&] { pg->reduce(at::ones({2}), 3, ReduceOp::kSum); }),
                    HasSubstr("reduce: root 3 is not a rank of a group of 3"));
      },
      test::test_options());
}

TEST(ProcessGroupTest, BarrierHoldsEveryRankUntilAllArrived) {
  const int world = 3;
  std::atomic<int> arrived{0};
  run_ranks_in_threads(
      world,
      [&](std::shared_ptr<ProcessGroup> pg) {
        // Later ranks arrive later; nobody may leave before the last one came.
        std::this_thread::sleep_for(std::chrono::milliseconds(100 * pg->rank()));
        arrived.fetch_add(1);
        pg->barrier()->wait();
        EXPECT_EQ(arrived.load(), world);
      },
      test::test_options());
}

TEST(ProcessGroupTest, AsyncOpsCompleteInIssueOrder) {
  const int world = 3;
  const int64_t chunk = 5;
  run_ranks_in_threads(
      world,
      [](std::shared_ptr<ProcessGroup> pg) {
        const int rank = pg->rank();
        auto gather_in = rank_input(rank, chunk);
        auto gather_out = at::empty({world * chunk});
        auto rs_in = rank_input(rank, world * chunk);
        auto rs_out = at::empty({chunk});
        auto ar = rank_input(rank, 4);
        auto bc = rank_input(rank, 6);
        std::vector<WorkHandle> works{
            pg->all_gather_into_tensor(gather_out, gather_in),
            pg->reduce_scatter_tensor(rs_out, rs_in, ReduceOp::kSum),
            pg->all_reduce(ar, ReduceOp::kSum),
            pg->broadcast(bc, 1),
            pg->barrier(),
        };
        for (auto& work : works) {
          work->wait();
          EXPECT_TRUE(work->is_completed());
        }
        for (int r = 0; r < world; ++r) {
          EXPECT_TRUE(at::equal(gather_out.narrow(0, r * chunk, chunk), rank_input(r, chunk)));
        }
        auto rs_expected = reference_sum(world, world * chunk).narrow(0, rank * chunk, chunk);
        EXPECT_TRUE(at::allclose(rs_out.to(at::kDouble), rs_expected, 1e-5, 1e-5));
        EXPECT_TRUE(at::allclose(ar.to(at::kDouble), reference_sum(world, 4), 1e-5, 1e-5));
        EXPECT_TRUE(at::equal(bc, rank_input(1, 6)));
      },
      test::test_options());
}

TEST(ProcessGroupTest, ReduceScatterSendsOnlyItsShareOfTheInput) {
  const int world = 4;
  const int64_t chunk = 1000;
  run_ranks_in_threads(
      world,
      [](std::shared_ptr<ProcessGroup> pg) {
        auto input = rank_input(pg->rank(), world * chunk);
        auto output = at::empty({chunk});
        pg->reduce_scatter_tensor(output, input, ReduceOp::kSum)->wait();
        const int64_t input_bytes = world * chunk * 4;
        auto rs = pg->counters().reduce_scatter;
        EXPECT_EQ(rs.calls, 1);
        EXPECT_EQ(rs.payload_bytes, input_bytes);
        EXPECT_EQ(rs.sent_bytes, input_bytes * (world - 1) / world);  // 12000 of 16000 bytes

        auto tensor = rank_input(pg->rank(), world * chunk);
        pg->all_reduce(tensor, ReduceOp::kSum)->wait();
        auto counters = pg->counters();
        EXPECT_EQ(counters.all_reduce.payload_bytes, input_bytes);
        EXPECT_EQ(2 * counters.reduce_scatter.sent_bytes, counters.all_reduce.sent_bytes);

        auto gathered = at::empty({world * chunk});
        pg->all_gather_into_tensor(gathered, output)->wait();
        pg->broadcast(tensor, 3)->wait();
        counters = pg->counters();
        EXPECT_EQ(counters.all_gather.payload_bytes, input_bytes);
        EXPECT_EQ(counters.all_gather.sent_bytes, input_bytes * (world - 1) / world);
        EXPECT_EQ(counters.broadcast.sent_bytes, pg->rank() == 3 ? input_bytes : 0);

        pg->reset_counters();
        EXPECT_EQ(pg->counters().reduce_scatter.sent_bytes, 0);
      },
      test::test_options());
}

TEST(ProcessGroupTest, InvalidTensorsThrowAtCallTimeNamingOpAndSizes) {
  run_ranks_in_threads(
      2,
      [](std::shared_ptr<ProcessGroup> pg) {
        auto input = at::zeros({6});
        auto wrong = at::zeros({10});
        EXPECT_THAT(test::error_message([&] { pg->all_gather_into_tensor(wrong, input); }),
                    AllOf(HasSubstr("all_gather_into_tensor"), HasSubstr("output has 10 elements"),
                          HasSubstr("need 12")));
        EXPECT_THAT(test::error_message(
                        [&] { pg->reduce_scatter_tensor(at::zeros({4}), input, ReduceOp::kSum); }),
                    AllOf(HasSubstr("reduce_scatter_tensor"), HasSubstr("input has 6 elements"),
                          HasSubstr("need 8")));
        EXPECT_THAT(test::error_message([&] {
                      pg->reduce_scatter_tensor(at::zeros({3}, at::kDouble), input, ReduceOp::kSum);
                    }),
                    AllOf(HasSubstr("Double"), HasSubstr("Float")));
        auto strided = at::zeros({4, 6}).t();
        EXPECT_THAT(test::error_message([&] { pg->all_reduce(strided, ReduceOp::kSum); }),
                    AllOf(HasSubstr("all_reduce"), HasSubstr("contiguous")));
        EXPECT_THAT(test::error_message([&] { pg->broadcast(input, 2); }),
                    HasSubstr("root 2 is not a rank of a group of 2"));
        EXPECT_THAT(
            test::error_message([&] { pg->all_reduce(at::zeros({2}, at::kLong), ReduceOp::kAvg); }),
            HasSubstr("kAvg"));
        // Rejected calls queue nothing: the group still works and both ranks stay in step.
        auto ok = at::ones({2});
        pg->all_reduce(ok, ReduceOp::kSum)->wait();
        EXPECT_TRUE(at::equal(ok, at::full({2}, 2.0f)));
      },
      test::test_options());
}

TEST(ProcessGroupTest, RanksGetOneIntraOpThreadEach) {
  const int before = at::get_num_threads();
  run_ranks_in_threads(
      2, [](std::shared_ptr<ProcessGroup>) { EXPECT_EQ(at::get_num_threads(), 1); },
      test::test_options());
  EXPECT_EQ(at::get_num_threads(), before);
}

TEST(ProcessGroupTest, RunRanksInThreadsRethrowsTheLowestFailingRank) {
  const auto message = test::error_message([] {
    run_ranks_in_threads(
        3,
        [](std::shared_ptr<ProcessGroup> pg) {
          TORCH_CHECK(pg->rank() == 0, "boom on rank ", pg->rank());
        },
        test::test_options());
  });
  EXPECT_THAT(message, HasSubstr("rank 1: boom on rank 1"));
  EXPECT_THAT(message, HasSubstr("rank 2: boom on rank 2"));
  EXPECT_LT(message.find("rank 1:"), message.find("rank 2:"));
}

// Rank 1 joins the group but never calls the collective. Rank 0 must fail after about the
// timeout, naming itself, the op, the peer and the timeout; later ops must fail fast.
// on_stream: wait through Work::wait_on_stream, which a host backend (gloo) must treat as wait().
void expect_timeout_names_rank_op_and_peer(const std::string& op_name,
                                           const std::function<WorkHandle(ProcessGroup&)>& issue,
                                           bool on_stream = false) {
  const auto timeout = std::chrono::milliseconds(1500);
  std::promise<void> rank0_done;
  auto rank0_done_future = rank0_done.get_future().share();
  std::string message;
  std::string later_message;
  std::chrono::milliseconds elapsed{0};
  run_ranks_in_threads(
      2,
      [&](std::shared_ptr<ProcessGroup> pg) {
        if (pg->rank() == 1) {
          // Stay in the group (without calling anything) until rank 0 gave up, so rank 0 sees a
          // silent peer rather than a closed connection. Bounded, so this test cannot hang.
          rank0_done_future.wait_for(std::chrono::seconds(20));
          return;
        }
        const auto start = std::chrono::steady_clock::now();
        auto work = issue(*pg);
        message = test::error_message([&] { on_stream ? work->wait_on_stream() : work->wait(); });
        elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(
            std::chrono::steady_clock::now() - start);
        rank0_done.set_value();
        later_message = test::error_message([&] { pg->barrier()->wait(); });
      },
      test::test_options(timeout));

  EXPECT_THAT(message, HasSubstr("rank 0 of 2"));
  EXPECT_THAT(message, HasSubstr(op_name));
  EXPECT_THAT(message, HasSubstr("timed out after 1500 ms"));
  EXPECT_THAT(message, HasSubstr("waiting for rank 1"));
  EXPECT_GE(elapsed.count(), 1000) << message;
  EXPECT_LE(elapsed.count(), 6000) << message;
  EXPECT_THAT(later_message, AllOf(HasSubstr("barrier"), HasSubstr("broken"),
                                   HasSubstr("timed out after 1500 ms")));
  std::cerr << "timeout message: " << message << "\nlater op: " << later_message << "\n";
}

TEST(ProcessGroupTest, ReduceScatterTimesOutNamingRankOpAndPeer) {
  expect_timeout_names_rank_op_and_peer("reduce_scatter_tensor", [](ProcessGroup& pg) {
    return pg.reduce_scatter_tensor(at::empty({4}), at::ones({8}), ReduceOp::kSum);
  });
}

TEST(ProcessGroupTest, AllGatherTimesOutNamingRankOpAndPeer) {
  expect_timeout_names_rank_op_and_peer("all_gather_into_tensor", [](ProcessGroup& pg) {
    return pg.all_gather_into_tensor(at::empty({8}), at::ones({4}));
  });
}

// The runtime orders a device stream with wait_on_stream; on a host backend that is a wait, with
// the same deadline and message.
TEST(ProcessGroupTest, WaitOnStreamOfAHostBackendTimesOutLikeWait) {
  expect_timeout_names_rank_op_and_peer(
      "all_gather_into_tensor",
      [](ProcessGroup& pg) { return pg.all_gather_into_tensor(at::empty({8}), at::ones({4})); },
      /*on_stream=*/true);
}

TEST(ProcessGroupTest, PeerThatDiesFailsTheCollectiveWithoutWaitingForTheTimeout) {
  // The timeout is long: only the closed connection can end rank 0's wait in time.
  std::string message;
  const auto start = std::chrono::steady_clock::now();
  const auto rethrown = test::error_message([&] {
    run_ranks_in_threads(
        2,
        [&](std::shared_ptr<ProcessGroup> pg) {
          if (pg->rank() == 1) {
            TORCH_CHECK(false, "rank 1 gives up");  // run_ranks_in_threads drops its group at once
          }
          auto tensor = at::ones({16});
          message = test::error_message([&] { pg->all_reduce(tensor, ReduceOp::kSum)->wait(); });
        },
        test::test_options(std::chrono::seconds(30)));
  });
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_LT(elapsed, std::chrono::seconds(10)) << message;
  EXPECT_THAT(message,
              AllOf(HasSubstr("rank 0 of 2"), HasSubstr("all_reduce"), HasSubstr("rank 1")));
  EXPECT_THAT(rethrown, HasSubstr("rank 1: rank 1 gives up"));
  std::cerr << "peer died: " << message << "\n";
}

}  // namespace
}  // namespace fsdp
