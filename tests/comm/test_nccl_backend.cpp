// The nccl backend where no GPU is needed: that a CUDA build lists it, that asking for it on a
// machine without a CUDA device fails at once naming the fault (from the library, and from
// fsdp-train and fsdp-comm-bench, launched locally and under torchrun's variables), and the
// argument checks every backend shares (collective_checks.h), which the nccl backend runs before
// it touches c10d. The collectives themselves, on a GPU, are tests/cuda/'s.
#include <ATen/ATen.h>
#include <fsdp/comm/process_group.h>
#include <fsdp/comm/rendezvous.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "comm/collective_checks.h"
#include "support/test_support.h"

namespace fsdp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using Clock = std::chrono::steady_clock;

bool built_with_nccl() {
  const auto names = available_backends();
  return std::find(names.begin(), names.end(), "nccl") != names.end();
}

// Skips the test, with the reason, where its premise (a CUDA build, no CUDA device) is false.
#define SKIP_UNLESS_NCCL_WITHOUT_DEVICE()                                                     \
  do {                                                                                        \
    if (!built_with_nccl()) GTEST_SKIP() << "this build has no nccl backend (FSDP_CUDA off)"; \
    if (torch::cuda::is_available())                                                          \
      GTEST_SKIP() << "a CUDA device is present: the cuda-labelled tests cover this machine"; \
  } while (0)

TEST(NcclBackend, IsListedExactlyWhenTheBuildHasIt) {
#ifdef FSDP_WITH_NCCL
  EXPECT_TRUE(built_with_nccl()) << "built with FSDP_WITH_NCCL but available_backends() omits nccl";
#else
  EXPECT_FALSE(built_with_nccl()) << "built without the CUDA path but nccl is listed";
#endif
  EXPECT_EQ(available_backends().front(), "gloo");
}

TEST(NcclBackend, GroupWithoutACudaDeviceFailsAtOnceNamingTheFault) {
  SKIP_UNLESS_NCCL_WITHOUT_DEVICE();
  ProcessGroupOptions options = test::test_options(std::chrono::seconds(20));
  options.backend = "nccl";
  const auto start = Clock::now();
  const std::string message = test::error_message([&] {
    run_ranks_in_threads(
        2, [](auto) {}, options);
  });
  EXPECT_THAT(message, AllOf(HasSubstr("fsdp: rank "),
                             HasSubstr(" of 2: the nccl backend moves "
                                       "CUDA tensors, but this process "
                                       "sees no CUDA device"),
                             HasSubstr("use the gloo backend")));
  // Both ranks joined the store and refused at once: no wait for the 20 s timeout.
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 10.0);
}

// A group that claims cuda:0 without a device behind it: enough for the checks, which read only
// the group's rank, size, device and name.
class ClaimsCudaGroup final : public ProcessGroup {
 public:
  int rank() const override { return 1; }
  int size() const override { return 2; }
  c10::Device device() const override { return c10::Device(c10::kCUDA, 0); }
  std::string backend_name() const override { return "nccl"; }
  WorkHandle all_gather_into_tensor(const at::Tensor&, const at::Tensor&) override { return {}; }
  WorkHandle reduce_scatter_tensor(const at::Tensor&, const at::Tensor&, ReduceOp) override {
    return {};
  }
  WorkHandle all_reduce(const at::Tensor&, ReduceOp) override { return {}; }
  WorkHandle broadcast(const at::Tensor&, int) override { return {}; }
  WorkHandle reduce(const at::Tensor&, int, ReduceOp) override { return {}; }
  WorkHandle barrier() override { return {}; }
  std::shared_ptr<ProcessGroup> split(const std::vector<int>&, const std::string&) override {
    return nullptr;
  }
};

TEST(NcclBackend, CpuTensorsHandedToACudaGroupAreRefusedNamingBothDevices) {
  ClaimsCudaGroup group;
  const at::Tensor in = at::ones({4});
  const at::Tensor out = at::empty({8});
  EXPECT_EQ(test::error_message([&] { detail::check_all_gather_args(group, out, in); }),
            "fsdp: rank 1 of 2: all_gather_into_tensor: the nccl backend moves cuda:0 tensors, "
            "but output is on cpu");
  EXPECT_THAT(test::error_message([&] { detail::check_reduce_scatter_args(group, in, out); }),
              HasSubstr("reduce_scatter_tensor: the nccl backend moves cuda:0 tensors, but "
                        "output is on cpu"));
  EXPECT_THAT(
      test::error_message([&] { detail::check_all_reduce_args(group, in, ReduceOp::kSum); }),
      HasSubstr("all_reduce: the nccl backend moves cuda:0 tensors, but tensor is on cpu"));
  EXPECT_THAT(test::error_message([&] { detail::check_broadcast_args(group, in, 0); }),
              HasSubstr("broadcast: the nccl backend moves cuda:0 tensors, but tensor is on cpu"));
  EXPECT_THAT(test::error_message([&] { detail::check_reduce_args(group, in, 0); }),
              HasSubstr("reduce: the nccl backend moves cuda:0 tensors, but tensor is on cpu"));
}

// The same checks on a CPU group (gloo's), for the faults that come after the device: every
// backend gets these messages, since every backend calls these functions. (The flight recorder
// around every group appends what it knows to each.)
TEST(CollectiveChecks, DtypeCountRootAndLayoutFaultsNameTheValues) {
  run_ranks_in_threads(
      2,
      [](std::shared_ptr<ProcessGroup> pg) {
        const std::string me = "fsdp: rank " + std::to_string(pg->rank()) + " of 2: ";
        EXPECT_THAT(
            test::error_message(
                [&] { pg->all_gather_into_tensor(at::empty({8}, at::kBFloat16), at::ones({4})); }),
            StartsWith(me + "all_gather_into_tensor: output is BFloat16 but input is Float"));
        EXPECT_THAT(
            test::error_message([&] { pg->all_gather_into_tensor(at::empty({7}), at::ones({4})); }),
            StartsWith(
                me +
                "all_gather_into_tensor: output has 7 elements (sizes [7]) but 2 ranks x input "
                "of 4 elements (sizes [4]) need 8"));
        EXPECT_THAT(
            test::error_message(
                [&] { pg->reduce_scatter_tensor(at::empty({2}), at::ones({6}), ReduceOp::kSum); }),
            StartsWith(me + "reduce_scatter_tensor: input has 6 elements (sizes [6]) but 2 ranks x "
                            "output of 2 elements (sizes [2]) need 4"));
        EXPECT_THAT(
            test::error_message([&] {
              pg->reduce_scatter_tensor(at::empty({2}, at::kInt), at::ones({4}, at::kInt),
                                        ReduceOp::kSum);
            }),
            StartsWith(me +
                       "reduce_scatter_tensor: the gloo backend reduces Float, Double, BFloat16 "
                       "and Half, got Int"));
        EXPECT_THAT(test::error_message([&] { pg->broadcast(at::ones({3}), 2); }),
                    StartsWith(me + "broadcast: root 2 is not a rank of a group of 2"));
        EXPECT_THAT(
            test::error_message([&] { pg->all_reduce(at::ones({2}, at::kLong), ReduceOp::kAvg); }),
            StartsWith(me + "all_reduce: kAvg needs a floating point tensor, got Long"));
        EXPECT_THAT(test::error_message([&] {
                      pg->all_reduce(at::ones({4, 4}).t(), ReduceOp::kSum);
                    }),
                    HasSubstr(me + "all_reduce: tensor (sizes [4, 4], strides [1, 4]) must be "
                                   "contiguous"));
        EXPECT_THAT(test::error_message([&] {
                      pg->split({0, 2}, "bad");
                    }),
                    StartsWith(me + "split 'bad': rank 2 is outside this group of 2"));
        // The group is still usable: every refusal came before anything was queued.
        at::Tensor t = at::ones({2});
        pg->all_reduce(t, ReduceOp::kSum)->wait();
        EXPECT_TRUE(at::equal(t, at::full({2}, 2.0)));
      },
      test::test_options());
}

// The programs refuse --backend nccl before launching a rank when there is no device; a rank
// started by a launcher gets the library's refusal. Neither waits for a timeout.
TEST(NcclBackend, ProgramsRefuseItWithoutACudaDevice) {
  SKIP_UNLESS_NCCL_WITHOUT_DEVICE();
  const std::string no_device =
      "--backend nccl moves CUDA tensors, but this machine has no CUDA device "
      "(torch::cuda::device_count() is 0); use --backend gloo on the CPU";
  for (const std::string program : {"fsdp-comm-bench", "fsdp-train"}) {
    const auto start = Clock::now();
    const test::CommandResult r =
        test::run_command(test::program_path(program) + " --nproc 2 --backend nccl", 60);
    EXPECT_NE(r.exit_code, 0) << program << ": " << r.output;
    EXPECT_THAT(r.output, HasSubstr(no_device)) << program;
    EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 30.0) << program;
  }
  LoopbackSocket socket;  // rank 0's store takes it over
  socket.inherit_across_exec();
  const std::string env =
      "env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=" +
      std::to_string(socket.port()) + " FSDP_MASTER_LISTEN_FD=" + std::to_string(socket.fd()) + " ";
  const test::CommandResult r = test::run_command(
      env + test::program_path("fsdp-comm-bench") + " --backend nccl --timeout-s 20", 60);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output,
              HasSubstr("rank 0 of 1: the nccl backend moves CUDA tensors, but this process sees "
                        "no CUDA device"));
}

}  // namespace
}  // namespace fsdp
