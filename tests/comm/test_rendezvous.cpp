// Rendezvous: torchrun's variables, the join protocol's errors (missing ranks, disagreeing world
// sizes), the real TCPStore path on 127.0.0.1, and several groups over one store. Every test
// uses short timeouts, so a rendezvous that would hang fails the test instead.
#include <ATen/ATen.h>
#include <fsdp/comm/rendezvous.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "support/test_support.h"

namespace fsdp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

using EnvValues = std::vector<std::pair<std::string, std::optional<std::string>>>;

EnvValues torchrun_env(const std::string& rank, const std::string& world_size) {
  return {{"RANK", rank},
          {"WORLD_SIZE", world_size},
          {"LOCAL_RANK", rank},
          {"MASTER_ADDR", "127.0.0.1"},
          {"MASTER_PORT", "29511"}};
}

TEST(LaunchEnvTest, ReadsTorchrunVariables) {
  test::ScopedEnv env(torchrun_env("1", "2"));
  const LaunchEnv launch = launch_env_from_environment();
  EXPECT_EQ(launch.rank, 1);
  EXPECT_EQ(launch.world_size, 2);
  EXPECT_EQ(launch.local_rank, 1);
  EXPECT_EQ(launch.master_addr, "127.0.0.1");
  EXPECT_EQ(launch.master_port, 29511);
}

TEST(LaunchEnvTest, MissingWorldSizeIsNamed) {
  auto values = torchrun_env("0", "2");
  values[1].second = std::nullopt;
  test::ScopedEnv env(values);
  EXPECT_THAT(test::error_message([] { launch_env_from_environment(); }),
              AllOf(HasSubstr("WORLD_SIZE"), HasSubstr("not set")));
}

TEST(LaunchEnvTest, RankOutsideWorldIsNamedWithBothValues) {
  test::ScopedEnv env(torchrun_env("2", "2"));
  EXPECT_THAT(test::error_message([] { launch_env_from_environment(); }),
              HasSubstr("RANK=2 is outside [0, WORLD_SIZE=2)"));
}

// What Slurm's srun sets, with no torchrun variable: rank, world and local rank from SLURM_*, the
// master from the first host of the job's host list, one port per job.
EnvValues slurm_env(const std::string& nodelist) {
  return {{"RANK", std::nullopt},        {"WORLD_SIZE", std::nullopt},
          {"LOCAL_RANK", std::nullopt},  {"MASTER_ADDR", std::nullopt},
          {"MASTER_PORT", std::nullopt}, {"SLURM_PROCID", "3"},
          {"SLURM_NTASKS", "4"},         {"SLURM_LOCALID", "1"},
          {"SLURM_NODEID", "1"},         {"SLURM_JOB_NODELIST", nodelist},
          {"SLURM_JOB_ID", "123456"}};
}

TEST(LaunchEnvTest, ReadsSlurmVariablesWithTheMasterFromTheHostList) {
  for (const auto& [nodelist, master] :
       std::vector<std::pair<std::string, std::string>>{{"gpu[07-08],cpu1", "gpu07"},
                                                        {"a-node,b-node", "a-node"},
                                                        {"n[3,5-6]", "n3"},
                                                        {"10.9.0.1", "10.9.0.1"}}) {
    test::ScopedEnv env(slurm_env(nodelist));
    const LaunchEnv launch = launch_env_from_environment();
    EXPECT_EQ(launch.rank, 3);
    EXPECT_EQ(launch.world_size, 4);
    EXPECT_EQ(launch.local_rank, 1);
    EXPECT_EQ(launch.master_addr, master) << nodelist;
    EXPECT_EQ(launch.master_port, 20000 + 123456 % 20000);
  }
}

TEST(LaunchEnvTest, SlurmMistakesAreNamed) {
  auto values = slurm_env("node[");
  {
    test::ScopedEnv env(values);
    EXPECT_THAT(test::error_message([] { launch_env_from_environment(); }),
                HasSubstr("host list 'node[' is malformed"));
  }
  values[6].second = std::nullopt;  // SLURM_NTASKS
  test::ScopedEnv env(values);
  EXPECT_THAT(test::error_message([] { launch_env_from_environment(); }),
              HasSubstr("SLURM_PROCID is set but SLURM_NTASKS is not"));
}

// What Open MPI's mpirun sets, plus the master the job passes with -x.
EnvValues open_mpi_env(std::optional<std::string> master_addr) {
  return {{"RANK", std::nullopt},
          {"WORLD_SIZE", std::nullopt},
          {"LOCAL_RANK", std::nullopt},
          {"SLURM_PROCID", std::nullopt},
          {"MASTER_ADDR", std::move(master_addr)},
          {"MASTER_PORT", std::nullopt},
          {"OMPI_COMM_WORLD_RANK", "5"},
          {"OMPI_COMM_WORLD_SIZE", "8"},
          {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
          {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}};
}

TEST(LaunchEnvTest, ReadsOpenMpiVariablesWithThePassedMaster) {
  test::ScopedEnv env(open_mpi_env("node0"));
  const LaunchEnv launch = launch_env_from_environment();
  EXPECT_EQ(launch.rank, 5);
  EXPECT_EQ(launch.world_size, 8);
  EXPECT_EQ(launch.local_rank, 1);
  EXPECT_EQ(launch.master_addr, "node0");
  EXPECT_EQ(launch.master_port, 29500);
}

// Without MASTER_ADDR the master's address is left to MPI, which init_process_group asks
// (tests/tools/test_mpi_train.cpp launches real mpirun jobs that way). A build without MPI
// cannot, and says how to pass the address instead.
TEST(LaunchEnvTest, OpenMpiWithoutAMasterLeavesItToMpi) {
  {
    test::ScopedEnv env(open_mpi_env(std::nullopt));
    const LaunchEnv launch = launch_env_from_environment();
    EXPECT_TRUE(launch.master_from_mpi);
    EXPECT_TRUE(launch.launched_by_mpirun);
    EXPECT_EQ(launch.local_world_size, 2);
    const auto& backends = available_backends();
    if (std::find(backends.begin(), backends.end(), "mpi") != backends.end()) {
      EXPECT_EQ(default_backend(launch), "mpi");
    } else {
      EXPECT_EQ(default_backend(launch), "gloo");
      EXPECT_THAT(test::error_message([&] { init_process_group(launch); }),
                  AllOf(HasSubstr("this build has no MPI"), HasSubstr("mpirun -x MASTER_ADDR=")));
    }
  }
  auto values = open_mpi_env("node0");
  values[7].second = "eight";  // OMPI_COMM_WORLD_SIZE
  test::ScopedEnv env(values);
  EXPECT_THAT(test::error_message([] { launch_env_from_environment(); }),
              HasSubstr("OMPI_COMM_WORLD_SIZE='eight' is not a non-negative integer"));
}

TEST(LaunchEnvTest, MalformedValueIsQuoted) {
  auto values = torchrun_env("0", "2");
  values[4].second = "29x";
  test::ScopedEnv env(values);
  EXPECT_THAT(test::error_message([] { launch_env_from_environment(); }),
              HasSubstr("MASTER_PORT='29x' is not an integer"));
}

TEST(LaunchEnvTest, ScopedEnvRestoresTheEnvironment) {
  ::setenv("FSDP_TEST_SCOPED", "before", 1);
  {
    test::ScopedEnv env({{"FSDP_TEST_SCOPED", std::nullopt}});
    EXPECT_EQ(std::getenv("FSDP_TEST_SCOPED"), nullptr);
  }
  EXPECT_STREQ(std::getenv("FSDP_TEST_SCOPED"), "before");
  ::unsetenv("FSDP_TEST_SCOPED");
}

TEST(RendezvousTest, WorldSizeMismatchIsReportedWithBothValues) {
  const RendezvousStore store = make_in_process_store(std::chrono::seconds(20));
  const int world_sizes[2] = {2, 3};
  const auto errors = test::run_threads(2, [&](int rank) {
    init_process_group(store, rank, world_sizes[rank],
                       test::test_options(std::chrono::milliseconds(2000)));
  });
  std::cerr << "rank 0: " << errors[0] << "\nrank 1: " << errors[1] << "\n";
  EXPECT_THAT(errors[1], HasSubstr("world size mismatch: rank 1 was started with WORLD_SIZE=3 "
                                   "but rank 0 with WORLD_SIZE=2"));
  // Rank 0 meets rank 1's key while it waits for it, and fails the same way, without a hang.
  EXPECT_THAT(errors[0], HasSubstr("world size mismatch: rank 0 was started with WORLD_SIZE=2 "
                                   "but rank 1 with WORLD_SIZE=3"));
}

TEST(RendezvousTest, MissingRanksAreListed) {
  const RendezvousStore store = make_in_process_store(std::chrono::seconds(20));
  const auto start = std::chrono::steady_clock::now();
  // A world of 4 where only ranks 0 and 1 start.
  const auto errors = test::run_threads(2, [&](int rank) {
    init_process_group(store, rank, 4, test::test_options(std::chrono::milliseconds(1000)));
  });
  const auto elapsed = std::chrono::steady_clock::now() - start;
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_THAT(errors[rank], AllOf(HasSubstr("rank " + std::to_string(rank) + " of 4"),
                                    HasSubstr("rendezvous timed out after 1000 ms: ranks 2, 3 "
                                              "of 4 never arrived")));
  }
  EXPECT_LT(elapsed, std::chrono::seconds(5));
  std::cerr << errors[0] << "\n";
}

TEST(RendezvousTest, OneMissingRankIsNamed) {
  const RendezvousStore store = make_in_process_store(std::chrono::seconds(20));
  const auto errors = test::run_threads(2, [&](int rank) {
    init_process_group(store, rank, 3, test::test_options(std::chrono::milliseconds(800)));
  });
  EXPECT_THAT(errors[0], HasSubstr("rank 2 of 3 never arrived"));
  EXPECT_THAT(errors[1], HasSubstr("rank 2 of 3 never arrived"));
}

TEST(RendezvousTest, SeveralGroupsOverOneStoreStaySeparate) {
  const RendezvousStore store = make_in_process_store(std::chrono::seconds(20));
  const auto errors = test::run_threads(2, [&](int rank) {
    auto first = init_process_group(store, rank, 2, test::test_options());
    auto second = init_process_group(store, rank, 2, test::test_options());
    auto a = at::full({3}, 1.0f + rank);
    auto b = at::full({3}, 10.0f * (rank + 1));
    // Issued in opposite orders on the two groups: each group has its own queue and transport.
    auto wa = first->all_reduce(a, ReduceOp::kSum);
    auto wb = second->all_reduce(b, ReduceOp::kSum);
    wb->wait();
    wa->wait();
    TORCH_CHECK(at::equal(a, at::full({3}, 3.0f)), "first group summed to ", a);
    TORCH_CHECK(at::equal(b, at::full({3}, 30.0f)), "second group summed to ", b);
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

// Rank 0's store takes over a socket bound before any rank starts, as fsdp-train --nproc does.
TEST(RendezvousTest, TcpStoreFromLaunchEnv) {
  LoopbackSocket socket;
  const int port = socket.port();
  const int listen_fd = socket.release();  // the store owns it from here
  std::vector<std::shared_ptr<ProcessGroup>> groups(2);
  const auto errors = test::run_threads(2, [&](int rank) {
    LaunchEnv env;
    env.rank = rank;
    env.world_size = 2;
    env.local_rank = rank;
    env.master_addr = "127.0.0.1";
    env.master_port = port;
    if (rank == 0) env.master_listen_fd = listen_fd;
    auto pg = init_process_group(env, test::test_options(std::chrono::seconds(10)));
    TORCH_CHECK(pg->rank() == rank && pg->size() == 2, "got rank ", pg->rank(), " of ", pg->size());
    auto t = at::full({4}, static_cast<float>(rank + 1));
    pg->all_reduce(t, ReduceOp::kSum)->wait();
    TORCH_CHECK(at::equal(t, at::full({4}, 3.0f)), "all_reduce gave ", t);
    pg->barrier()->wait();
    // Kept until both threads joined: rank 0 hosts the store, and neither rank should close its
    // connections while the other may still read from them.
    groups[rank] = pg;
  });
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

TEST(RendezvousTest, ClientTimesOutWhenRankZeroNeverComes) {
  LaunchEnv env;
  env.rank = 1;
  env.world_size = 2;
  env.local_rank = 1;
  const LoopbackSocket bound_not_listening(/*listen=*/false);  // connections are refused
  env.master_port = bound_not_listening.port();
  const auto start = std::chrono::steady_clock::now();
  const auto message = test::error_message(
      [&] { init_process_group(env, test::test_options(std::chrono::milliseconds(1500))); });
  const auto elapsed = std::chrono::steady_clock::now() - start;
  EXPECT_THAT(message, AllOf(HasSubstr("rank 1 of 2"),
                             HasSubstr("could not reach the rendezvous store of rank 0"),
                             HasSubstr(std::to_string(env.master_port)), HasSubstr("1500 ms")));
  EXPECT_LT(elapsed, std::chrono::seconds(8));
  std::cerr << message << "\n";
}

}  // namespace
}  // namespace fsdp
