// The nccl backend on a GPU (ctest label `cuda`): every collective in fp32, bf16 and fp16, on
// one rank in this process and on two ranks as two processes, each result compared with the
// gloo backend's on CPU copies of the same inputs; its counters against gloo's; host tensors
// staged through the device, and a call mixing devices refused; a collective one rank never joins
// timing out with an error that names the rank and the op, both when the host waits for it and when
// only a stream does (the watchdog's message, naming the unit too). Without a CUDA device every
// test skips, with the reason, and ctest shows it skipped.
//
// Two ranks need two processes: NCCL puts one rank per device per host in a communicator. With
// two or more GPUs rank r uses device r; with one, each process gets its own NCCL_HOSTID (and
// NCCL_SOCKET_IFNAME=lo), so NCCL sees two hosts and connects them over sockets. If NCCL still
// refuses two ranks on one device, the test skips, quoting NCCL.
//
// The processes are this binary, started with FSDP_NCCL_TEST_CHILD=1 and torchrun's variables:
// main() then runs child_main() instead of the tests.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <fsdp/comm/process_group.h>
#include <fsdp/comm/rendezvous.h>
#include <fsdp/util/error.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "comm/bootstrap.h"
#include "support/test_support.h"

namespace fsdp::test {
namespace {

using ::testing::HasSubstr;

#define SKIP_WITHOUT_CUDA()                                                                   \
  do {                                                                                        \
    if (!torch::cuda::is_available())                                                         \
      GTEST_SKIP() << "no CUDA device: torch::cuda::is_available() is false on this machine"; \
  } while (0)

const std::vector<at::ScalarType> kDtypes = {at::kFloat, at::kBFloat16, at::kHalf};
// Odd sizes too, so that a chunk boundary off by one shows.
const std::vector<int64_t> kCounts = {1, 257, 65536 + 3};

// Distinct, non-trivial data for each rank, of either sign; any rank can rebuild any rank's.
at::Tensor rank_input(int rank, int64_t numel, at::ScalarType dtype) {
  auto x = at::arange(numel, at::kDouble);
  return (at::sin(x * (0.37 * (rank + 1))) * (rank + 1) + 0.25 * rank).to(dtype);
}

// The largest difference a correct reduction may show against gloo's: the results agree to the
// last place of the dtype (both round each sum once, from float32), so allow one unit there.
double tolerance(at::ScalarType dtype, const at::Tensor& expected) {
  const double eps = dtype == at::kFloat ? 1.2e-7 : dtype == at::kBFloat16 ? 7.9e-3 : 9.8e-4;
  return eps * std::max(1.0, expected.abs().max().item<double>());
}

// "" when nccl (a CUDA tensor) matches gloo (a CPU tensor), else what differs.
std::string compare(const std::string& what, const at::Tensor& nccl, const at::Tensor& gloo) {
  const at::Tensor ours = nccl.cpu().to(at::kDouble);
  const at::Tensor theirs = gloo.to(at::kDouble);
  if (ours.sizes() != theirs.sizes()) return what + ": sizes differ";
  if (ours.numel() == 0) return "";
  const double diff = (ours - theirs).abs().max().item<double>();
  const double tol = tolerance(gloo.scalar_type(), theirs);
  if (diff <= tol) return "";
  return what + ": max |nccl - gloo| = " + std::to_string(diff) + " > " + std::to_string(tol);
}

// Every collective of both groups on the same inputs, in every dtype and count; returns the
// mismatches (empty when all agree). nccl and gloo are this rank's handles on groups of the same
// ranks.
std::vector<std::string> compare_every_collective(ProcessGroup& nccl, ProcessGroup& gloo) {
  std::vector<std::string> faults;
  auto check = [&](const std::string& what, const at::Tensor& a, const at::Tensor& b) {
    const std::string fault = compare(what, a, b);
    if (!fault.empty()) faults.push_back(fault);
  };
  const c10::Device cuda = nccl.device();
  const int w = nccl.size();
  const int r = nccl.rank();
  for (const auto dtype : kDtypes) {
    for (const int64_t n : kCounts) {
      const std::string at_ =
          std::string(" (") + c10::toString(dtype) + ", " + std::to_string(n) + " elements)";
      const at::Tensor in = rank_input(r, n, dtype);
      const at::Tensor in_w = rank_input(r, n * w, dtype);

      at::Tensor g_out = at::empty({n * w}, in.options());
      at::Tensor c_out = at::empty({n * w}, in.options().device(cuda));
      gloo.all_gather_into_tensor(g_out, in)->wait();
      nccl.all_gather_into_tensor(c_out, in.to(cuda))->wait();
      check("all_gather_into_tensor" + at_, c_out, g_out);

      for (const auto op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        const std::string name = op == ReduceOp::kSum ? " sum" : " avg";
        at::Tensor g_rs = at::empty({n}, in.options());
        at::Tensor c_rs = at::empty({n}, in.options().device(cuda));
        const at::Tensor c_in_w = in_w.to(cuda);
        gloo.reduce_scatter_tensor(g_rs, in_w, op)->wait();
        nccl.reduce_scatter_tensor(c_rs, c_in_w, op)->wait();
        check("reduce_scatter_tensor" + name + at_, c_rs, g_rs);
        check("reduce_scatter_tensor leaves its input" + at_, c_in_w, in_w);

        at::Tensor g_ar = in.clone();
        at::Tensor c_ar = in.to(cuda);
        gloo.all_reduce(g_ar, op)->wait();
        nccl.all_reduce(c_ar, op)->wait();
        check("all_reduce" + name + at_, c_ar, g_ar);

        at::Tensor g_red = in.clone();
        at::Tensor c_red = in.to(cuda);
        gloo.reduce(g_red, /*root=*/0, op)->wait();
        nccl.reduce(c_red, /*root=*/0, op)->wait();
        check("reduce to rank 0" + name + at_, c_red, g_red);
      }
      at::Tensor g_b = in.clone();
      at::Tensor c_b = in.to(cuda);
      gloo.broadcast(g_b, /*root=*/w - 1)->wait();
      nccl.broadcast(c_b, /*root=*/w - 1)->wait();
      check("broadcast from the last rank" + at_, c_b, g_b);
    }
  }
  nccl.barrier()->wait();
  return faults;
}

// "" when both groups counted the same calls and bytes, else the first difference.
std::string compare_counters(const ProcessGroup& nccl, const ProcessGroup& gloo) {
  const CommCounters a = nccl.counters();
  const CommCounters b = gloo.counters();
  const std::vector<std::pair<const char*, std::pair<CollectiveCounters, CollectiveCounters>>>
      kinds = {{"all_gather", {a.all_gather, b.all_gather}},
               {"reduce_scatter", {a.reduce_scatter, b.reduce_scatter}},
               {"all_reduce", {a.all_reduce, b.all_reduce}},
               {"broadcast", {a.broadcast, b.broadcast}},
               {"reduce", {a.reduce, b.reduce}}};
  for (const auto& [name, pair] : kinds) {
    const auto& [x, y] = pair;
    if (x.calls != y.calls || x.payload_bytes != y.payload_bytes || x.sent_bytes != y.sent_bytes) {
      return std::string(name) + " counters: nccl " + std::to_string(x.calls) + " calls, " +
             std::to_string(x.payload_bytes) + " payload, " + std::to_string(x.sent_bytes) +
             " sent bytes; gloo " + std::to_string(y.calls) + ", " +
             std::to_string(y.payload_bytes) + ", " + std::to_string(y.sent_bytes);
    }
  }
  return "";
}

// A group of one rank over store on CUDA device 0, with options' backend set to nccl.
std::shared_ptr<ProcessGroup> one_rank_nccl(const RendezvousStore& store,
                                            ProcessGroupOptions options) {
  options.cuda_device = 0;
  options.backend = "nccl";
  return init_process_group(store, 0, 1, options);
}

TEST(NcclCuda, OneRankRunsEveryCollectiveInEveryDtypeAsGlooDoes) {
  SKIP_WITHOUT_CUDA();
  auto store = make_in_process_store(std::chrono::seconds(60));
  ProcessGroupOptions options = test_options(std::chrono::seconds(60));
  auto nccl = one_rank_nccl(store, options);
  options.backend = "gloo";
  auto gloo = init_process_group(store, 0, 1, options);
  EXPECT_EQ(nccl->backend_name(), "nccl");
  EXPECT_EQ(nccl->device(), c10::Device(c10::kCUDA, 0));
  const auto faults = compare_every_collective(*nccl, *gloo);
  EXPECT_TRUE(faults.empty()) << ::testing::PrintToString(faults);
  EXPECT_EQ(compare_counters(*nccl, *gloo), "");
}

// The runtime's agreement collectives hold int64s and bytes on the host: the group stages them
// through its device and returns a completed Work (see [Note: host tensors over NCCL]).
TEST(NcclCuda, HostTensorsAreStagedThroughTheDeviceAsGlooMovesThem) {
  SKIP_WITHOUT_CUDA();
  auto nccl = one_rank_nccl(make_in_process_store(std::chrono::seconds(60)),
                            test_options(std::chrono::seconds(60)));
  const at::Tensor mine = at::arange(13, at::kLong) * 7 - 40;
  at::Tensor all = at::full({13}, -1, at::kLong);
  WorkHandle work = nccl->all_gather_into_tensor(all, mine);
  EXPECT_TRUE(work->is_completed());
  work->wait();
  EXPECT_TRUE(at::equal(all, mine)) << all;
  at::Tensor summed = at::arange(1024, at::kByte);
  nccl->all_reduce(summed, ReduceOp::kSum)->wait();
  EXPECT_TRUE(at::equal(summed, at::arange(1024, at::kByte)));
  at::Tensor sent = at::full({5}, 3.5f);
  nccl->broadcast(sent, /*root=*/0)->wait();
  EXPECT_TRUE(at::equal(sent, at::full({5}, 3.5f)));
  EXPECT_EQ(nccl->counters().all_gather.calls, 1);
  EXPECT_EQ(nccl->counters().all_gather.payload_bytes, 13 * 8);
}

TEST(NcclCuda, MixedDevicesAreRefusedNamingBoth) {
  SKIP_WITHOUT_CUDA();
  auto nccl = one_rank_nccl(make_in_process_store(std::chrono::seconds(60)), test_options());
  const at::Tensor on_device = at::ones({4}, at::TensorOptions(nccl->device()));
  // The first line is the refusal; the flight recorder's report of the group follows it.
  EXPECT_THAT(error_message([&] { nccl->all_gather_into_tensor(at::empty({4}), on_device); }),
              ::testing::StartsWith("fsdp: rank 0 of 1: all_gather_into_tensor: the nccl backend "
                                    "moves cuda:0 tensors, but output is on cpu\n"));
  // The refusal came before anything was issued: the group still works.
  at::Tensor t = at::ones({4}, at::TensorOptions(nccl->device()));
  nccl->all_reduce(t, ReduceOp::kSum)->wait();
  EXPECT_TRUE(at::equal(t.cpu(), at::ones({4})));
}

// ---- Two ranks, as two processes ----

int child_failures = 0;

void child_check(bool ok, const std::string& what) {
  if (ok) return;
  ++child_failures;
  std::cerr << "CHILD FAILURE: " << what << std::endl;
}

// Where a rank is, on stderr at once: a rank that runs out of time shows how far it got.
void progress(int rank, const char* what) {
  std::cerr << "rank " << rank << ": " << what << std::endl;
}

// Rank 0's side of an all-reduce rank 1 never joins, waited on by the host: the call gives up
// at the deadline (3 s) with a message that names the rank and the op, and ends in how.
void check_host_timeout(ProcessGroup& group, const std::string& how, const std::string& what) {
  at::Tensor t = at::ones({16}, at::TensorOptions(group.device()));
  const std::string message = error_message([&] { group.all_reduce(t, ReduceOp::kSum)->wait(); });
  child_check(message.find("fsdp: rank 0 of 2: all_reduce timed out after 3000 ms waiting for "
                           "rank 1 " +
                           how) != std::string::npos,
              what + " timeout message: '" + message + "'");
}

// Rank 0's side of a collective rank 1 never joins, waited on through a stream as the runtime
// does on a device: wait_on_stream() returns at once, and once the deadline (3 s) has passed
// the watchdog has broken the group with a message naming the unit, which the next call throws.
void check_stream_wait_timeout(ProcessGroup& group) {
  at::Tensor t = at::ones({16}, at::TensorOptions(group.device()));
  const auto start = std::chrono::steady_clock::now();
  {
    const CollectiveLabel unit("h.3");
    group.all_reduce(t, ReduceOp::kSum)->wait_on_stream();
  }
  child_check(std::chrono::steady_clock::now() - start < std::chrono::seconds(1),
              "wait_on_stream() blocked the host");
  std::this_thread::sleep_for(std::chrono::milliseconds(4000));  // the deadline, and 10 polls
  const std::string message = error_message([&] { group.barrier()->wait(); });
  child_check(message.find("all_reduce of unit 'h.3' timed out after 3000 ms waiting for rank 1 "
                           "(a stream-ordered wait") != std::string::npos,
              "stream-ordered timeout message: '" + message + "'");
}

// One rank of the two-process test; returns its exit status. Rank 1 skips the last collective,
// which rank 0 must then report as timed out.
int child_main() {
  const LaunchEnv env = launch_env_from_environment();
  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(env.master_port);
  store_options.isServer = env.rank == 0;
  store_options.masterListenFd = env.master_listen_fd;
  store_options.waitWorkers = false;
  store_options.timeout = std::chrono::seconds(120);
  auto tcp = c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_options);
  const RendezvousStore store(std::make_shared<RendezvousStore::Impl>(RendezvousStore::Impl{tcp}));

  ProcessGroupOptions options = test_options(std::chrono::seconds(120));
  options.cuda_device = env.local_rank;
  options.backend = "gloo";
  auto gloo = init_process_group(store, env.rank, env.world_size, options);
  options.backend = "nccl";
  auto nccl = init_process_group(store, env.rank, env.world_size, options);
  child_check(nccl->device() == c10::Device(c10::kCUDA, env.local_rank % c10::cuda::device_count()),
              "device " + nccl->device().str());

  progress(env.rank, "connected gloo and nccl");
  for (const auto& fault : compare_every_collective(*nccl, *gloo)) child_check(false, fault);
  const std::string counters = compare_counters(*nccl, *gloo);
  child_check(counters.empty(), counters);
  progress(env.rank, "compared every collective with gloo's");

  // A subgroup of both ranks in reverse order: its rank 0 is world rank 1.
  auto reversed = nccl->split({1, 0}, "reversed");
  child_check(reversed && reversed->rank() == 1 - env.rank, "split rank");
  if (reversed) {
    at::Tensor t =
        at::full({3}, static_cast<float>(env.rank + 1), at::TensorOptions(nccl->device()));
    reversed->broadcast(t, /*root=*/0)->wait();  // from world rank 1
    child_check(at::equal(t.cpu(), at::full({3}, 2.0f)), "broadcast over the reversed split");
  }

  progress(env.rank, "broadcast over a split");
  // Collectives rank 1 never joins: rank 0 must give up after the timeout, naming the rank and
  // the op. Rank 1 stays alive meanwhile (a dead peer would fail it sooner, another way).
  ProcessGroupOptions short_options = options;
  short_options.timeout = std::chrono::seconds(3);
  auto at_issue = init_process_group(store, env.rank, env.world_size, short_options);
  auto lonely = init_process_group(store, env.rank, env.world_size, short_options);
  auto lonely_on_stream = init_process_group(store, env.rank, env.world_size, short_options);
  // Both ranks use the all-reduce once on these two, so that NCCL has connected its peers and
  // rank 0's lone call below waits on the device, not in its issue.
  for (auto* group : {lonely.get(), lonely_on_stream.get()}) {
    group->all_reduce(at::ones({16}, at::TensorOptions(group->device())), ReduceOp::kSum)->wait();
  }
  progress(env.rank, "connected the groups that time out");
  if (env.rank == 0) {
    // The group's first all-reduce: NCCL connects the peers inside the issue and blocks
    // there (see [Note: a deadline for the issue]).
    check_host_timeout(*at_issue, "(blocked in NCCL's issue", "issue");
    progress(env.rank, "checked a timeout in the issue");
    check_host_timeout(*lonely, "(the NCCL communicator was aborted)", "host wait");
    progress(env.rank, "checked a host wait's timeout");
    check_stream_wait_timeout(*lonely_on_stream);
    progress(env.rank, "checked a stream-ordered wait's timeout");
    tcp->set("timeout_checked", std::vector<uint8_t>{1});
    tcp->wait({"rank_1_done"});  // rank 0 hosts the store: it goes last
  } else {
    tcp->wait({"timeout_checked"});
    tcp->set("rank_1_done", std::vector<uint8_t>{1});
  }
  std::cout << "rank " << env.rank << ": " << child_failures << " failure(s)" << std::endl;
  // The timed-out communicator was aborted; the process ends without tearing the others down
  // in an order NCCL may not like, which is not what this test is about.
  std::fflush(nullptr);
  std::_Exit(child_failures == 0 ? 0 : 1);
}

// Within bench/gpu/run.sh's limit for the whole cuda label, so that a rank stuck in NCCL ends
// with its output in this test's report rather than the step's.
constexpr int kChildSeconds = 50;

TEST(NcclCuda, TwoRanksAsProcessesMatchGlooInEveryDtype) {
  SKIP_WITHOUT_CUDA();
  const int devices = static_cast<int>(torch::cuda::device_count());
  LoopbackSocket socket;  // rank 0's store takes it over
  socket.inherit_across_exec();
  const std::string self = "/proc/" + std::to_string(::getpid()) + "/exe";
  std::vector<CommandResult> results(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    // run_command runs it under timeout(1): the variables go through env(1).
    std::string env =
        "env FSDP_NCCL_TEST_CHILD=1 RANK=" + std::to_string(r) +
        " LOCAL_RANK=" + std::to_string(r) +
        " WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(socket.port()) + " ";
    if (r == 0) env += "FSDP_MASTER_LISTEN_FD=" + std::to_string(socket.fd()) + " ";
    if (devices < 2)
      env += "NCCL_HOSTID=fsdp-test-rank-" + std::to_string(r) + " NCCL_SOCKET_IFNAME=lo ";
    ranks.emplace_back(
        [&results, r, cmd = env + self] { results[r] = run_command(cmd, kChildSeconds); });
  }
  for (auto& t : ranks) t.join();
  const std::string both = results[0].output + "\n---- rank 1 ----\n" + results[1].output;
  if (devices < 2 && both.find("Duplicate GPU detected") != std::string::npos) {
    GTEST_SKIP() << "one GPU, and NCCL refuses two ranks on it even with distinct NCCL_HOSTIDs: "
                 << both.substr(both.find("Duplicate GPU detected"), 200);
  }
  EXPECT_EQ(results[0].exit_code, 0) << both;
  EXPECT_EQ(results[1].exit_code, 0) << both;
  EXPECT_THAT(results[0].output, HasSubstr("rank 0: 0 failure(s)"));
  EXPECT_THAT(results[1].output, HasSubstr("rank 1: 0 failure(s)"));
}

}  // namespace
}  // namespace fsdp::test

int main(int argc, char** argv) {
  if (std::getenv("FSDP_NCCL_TEST_CHILD")) {
    try {
      return fsdp::test::child_main();
    } catch (const std::exception& e) {
      std::cerr << "CHILD FAILURE: " << fsdp::error_message(e) << std::endl;
      return 1;
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
