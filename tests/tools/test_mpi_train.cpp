// fsdp-train under mpirun (builds with MPI only): the mpi backend gives the single process's
// numbers at every world size and strategy, its checkpoints resume over gloo, and a stalled rank
// ends the job by timeout with the operation named. mpirun gets no MASTER_ADDR: the store's
// address travels over MPI.
#include <support/checkpoint_util.h>
#include <support/test_support.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <string>
#include <vector>

namespace fsdp {
namespace {

using test::CommandResult;
using test::read_json_lines;
using ::testing::HasSubstr;

// 12 sequences: every W from 1 to 4 divides them.
const std::string kCommon = " --model tiny --global-batch 12 --seq-len 16 --seed 5 --quiet";

std::string mpirun(int ranks) {
  return std::string("env -u MASTER_ADDR -u MASTER_PORT ") + FSDP_MPIRUN + " -np " +
         std::to_string(ranks) + " ";
}

CommandResult run_ok(const std::string& command) {
  CommandResult r = test::run_command(command);
  EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.output;
  return r;
}

struct Curve {
  std::vector<double> loss, grad_norm;
};

Curve curve(const std::string& metrics) {
  Curve c;
  for (const auto& line : read_json_lines(metrics)) {
    c.loss.push_back(line["loss"].get<double>());
    c.grad_norm.push_back(line["grad_norm"].get<double>());
  }
  return c;
}

void expect_same_curve(const Curve& got, const Curve& want, double rel, const std::string& what) {
  ASSERT_EQ(got.loss.size(), want.loss.size()) << what;
  ASSERT_FALSE(got.loss.empty()) << what;
  for (size_t s = 0; s < got.loss.size(); ++s) {
    EXPECT_NEAR(got.loss[s], want.loss[s], rel * want.loss[s]) << what << ", step " << s + 1;
    EXPECT_NEAR(got.grad_norm[s], want.grad_norm[s], rel * want.grad_norm[s])
        << what << ", step " << s + 1;
  }
}

Curve single_process(const std::string& flags, const std::string& dir) {
  const std::string metrics = dir + "/single.jsonl";
  run_ok(test::fsdp_train_binary() + " --no-fsdp" + flags + " --metrics " + metrics);
  return curve(metrics);
}

TEST(MpiTrain, MpirunAloneGivesTheSingleProcessAtEveryWorldSize) {
  const std::string dir = test::temp_dir("mpi_world_sizes");
  const std::string flags = kCommon + " --steps 4";
  const Curve want = single_process(flags, dir);
  for (int w = 1; w <= 4; ++w) {
    const std::string metrics = dir + "/mpi" + std::to_string(w) + ".jsonl";
    const CommandResult r =
        run_ok(mpirun(w) + test::fsdp_train_binary() + flags + " --metrics " + metrics);
    expect_same_curve(curve(metrics), want, 1e-5, "mpirun -np " + std::to_string(w));
    const auto lines = read_json_lines(metrics);
    ASSERT_FALSE(lines.empty()) << r.output;
    EXPECT_EQ(lines.back()["ranks"].size(), static_cast<size_t>(w));
  }
}

// Every strategy over MPI against the same strategy over gloo, at W = 4: the same numbers up to
// the order of float additions in the reductions (MPI's algorithms, gloo's ring), and the same
// bytes counted.
TEST(MpiTrain, EveryStrategyMatchesGloo) {
  const std::string dir = test::temp_dir("mpi_strategies");
  for (const std::string mode :
       {"--strategy full_shard", "--strategy shard_grad_op", "--strategy no_shard",
        "--strategy hybrid_shard --replicate 2", "--reshard-after-forward 2"}) {
    const std::string flags = kCommon + " --steps 3 " + mode;
    const std::string mpi = dir + "/mpi.jsonl", gloo = dir + "/gloo.jsonl";
    run_ok(mpirun(4) + test::fsdp_train_binary() + flags + " --metrics " + mpi);
    run_ok(test::fsdp_train_binary() + " --nproc 4" + flags + " --metrics " + gloo);
    expect_same_curve(curve(mpi), curve(gloo), 1e-6, mode);
    const auto mpi_lines = read_json_lines(mpi), gloo_lines = read_json_lines(gloo);
    ASSERT_FALSE(mpi_lines.empty() || gloo_lines.empty()) << mode;
    const auto a = mpi_lines.back()["ranks"][0];
    const auto b = gloo_lines.back()["ranks"][0];
    for (const char* key : {"all_gather_bytes", "reduce_scatter_bytes", "param_bytes"}) {
      EXPECT_EQ(a[key], b[key]) << mode << ": " << key;
    }
  }
}

// A checkpoint written by 4 ranks over MPI resumes on 2 ranks over gloo, and the run continues
// as if it had never stopped.
TEST(MpiTrain, CheckpointFromMpiResumesOverGloo) {
  const std::string dir = test::temp_dir("mpi_checkpoint");
  // The learning rate is constant, so 3 steps then 3 more are the 6 steps of one run.
  const std::string flags = kCommon;
  const std::string whole = dir + "/whole.jsonl", first = dir + "/first.jsonl",
                    rest = dir + "/rest.jsonl";
  run_ok(test::fsdp_train_binary() + " --nproc 2 --steps 6" + flags + " --metrics " + whole);
  run_ok(mpirun(4) + test::fsdp_train_binary() + flags + " --steps 3 --save " + dir +
         "/ckpt --metrics " + first);
  run_ok(test::fsdp_train_binary() + " --nproc 2 --steps 6" + flags + " --resume " + dir +
         "/ckpt --metrics " + rest);
  Curve joined = curve(first);
  const Curve after = curve(rest);
  joined.loss.insert(joined.loss.end(), after.loss.begin(), after.loss.end());
  joined.grad_norm.insert(joined.grad_norm.end(), after.grad_norm.begin(), after.grad_norm.end());
  expect_same_curve(joined, curve(whole), 1e-5, "4 ranks over MPI, then 2 over gloo");
}

// MPI has no timeout: ours is the only thing between a stalled peer and a hang. Rank 1 stops
// issuing collectives at step 2, alive; rank 0 must fail within the timeout naming the op and
// rank 1, and mpirun then ends the stalled rank. algorithm: FSDP_MPI_ALGO's value.
void expect_a_stalled_rank_to_time_out(const std::string& algorithm) {
  const int timeout_s = 3;
  const auto start = std::chrono::steady_clock::now();
  const CommandResult r = test::run_command(
      "env FSDP_TRAIN_STALL_AT=2:1 FSDP_MPI_ALGO=" + algorithm + " " + mpirun(2) +
          test::fsdp_train_binary() + kCommon + " --steps 6 --timeout-s " +
          std::to_string(timeout_s) + " --trace " + test::temp_dir("mpi_stall_" + algorithm),
      120);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("rank 0 of 2"));
  EXPECT_THAT(r.output, HasSubstr("timed out after 3000 ms waiting for rank 1"));
  EXPECT_THAT(r.output,
              ::testing::ContainsRegex("all_gather|all-gather|reduce_scatter|all_reduce"));
  EXPECT_LT(seconds, timeout_s + 30) << r.output;
  std::cerr << "a stalled rank ended the mpirun job (" << algorithm << ") after " << seconds
            << " s\n";
}

TEST(MpiTrain, AStalledRankTimesOutNamingTheOperationAndTheRank) {
  expect_a_stalled_rank_to_time_out("auto");
}

// The same when every collective runs as our ring of point-to-point messages
// (src/comm/mpi/mpi_ring.h), which waits on several requests at once.
TEST(MpiTrain, AStalledRankOnTheRingTimesOutNamingTheOperationAndTheRank) {
  expect_a_stalled_rank_to_time_out("ring");
}

// A rank that dies is mpirun's to notice: it ends the whole job at once, far inside the
// timeout, and says which rank it was.
TEST(MpiTrain, AKilledRankEndsTheJobWithinSeconds) {
  const std::string dir = test::temp_dir("mpi_kill");
  const auto start = std::chrono::steady_clock::now();
  const CommandResult r =
      test::run_command("env FSDP_TRAIN_KILL_AT=2:1:" + dir + "/killed " + mpirun(3) +
                            test::fsdp_train_binary() + kCommon + " --steps 1000 --timeout-s 120",
                        120);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_TRUE(test::exists(dir + "/killed")) << r.output;
  EXPECT_THAT(r.output, ::testing::ContainsRegex("rank 1|signal 9|Killed")) << r.output;
  EXPECT_LT(seconds, 30) << r.output;
  std::cerr << "a killed rank ended the mpirun job after " << seconds << " s\n";
}

TEST(MpiTrain, BackendMpiWithoutMpirunSaysHowToLaunch) {
  const CommandResult r =
      test::run_command(test::fsdp_train_binary() + " --nproc 2 --backend mpi" + kCommon);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("--backend mpi needs its ranks started by MPI: run mpirun"));
}

// fsdp-comm-bench under mpirun measures the mpi backend by default, and says so in its JSON.
TEST(MpiCommBench, MeasuresTheMpiBackendUnderMpirun) {
  const std::string out = test::temp_dir("mpi_comm_bench") + "/bench.json";
  const CommandResult r =
      run_ok(mpirun(2) + test::program_path("fsdp-comm-bench") +
             " --min-bytes 1K --max-bytes 16K --iters 20 --warmup 2 --output " + out);
  std::ifstream in(out);
  ASSERT_TRUE(in.good()) << r.output;
  const nlohmann::json json = nlohmann::json::parse(in);
  EXPECT_EQ(json["backend"], "mpi");
  EXPECT_EQ(json["world_size"], 2);
  // 6 collectives at 1K, 4K and 16K, each timed.
  ASSERT_EQ(json["results"].size(), 18u) << json.dump(2);
  for (const auto& m : json["results"]) EXPECT_GT(m["time_s"].get<double>(), 0) << m.dump();
  EXPECT_EQ(json["fit"]["all_gather"]["points"], 3) << json.dump(2);
}

}  // namespace
}  // namespace fsdp
