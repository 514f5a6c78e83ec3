// fsdp-train --all-gather int8 (ZeRO++ qwZ) against --all-gather fp on the tiny model at W = 2,
// as real processes: the same data and initial weights, the int8 run's losses close to the fp32
// run's, its all-gathers about a quarter of the bytes, and the combinations that gather nothing
// refused.
#include "support/test_support.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <string>
#include <vector>

namespace fsdp::test {
namespace {

using ::testing::HasSubstr;

constexpr int kSteps = 30;
const std::string kCommon = "--nproc 2 --model tiny --steps " + std::to_string(kSteps) +
                            " --global-batch 8 --seq-len 32 --seed 5 --log-every 10 --val-every 0";

std::vector<nlohmann::json> train(const std::string& all_gather) {
  const std::string metrics = temp_path("qwz_" + all_gather + ".jsonl");
  const CommandResult r =
      run_fsdp_train(kCommon + " --all-gather " + all_gather + " --metrics " + metrics);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return read_json_lines(metrics);
}

int64_t all_gather_bytes(const nlohmann::json& step) {
  return step["ranks"][0]["all_gather_bytes"].get<int64_t>();
}

// The error bound makes the int8 run a small perturbation of the fp32 one: each gathered weight
// is off by at most 1/254 of its block's largest magnitude (uniform rounding noise, so about
// 1/880 of it on average), so the first step's loss, from the same masters, moves by a small
// multiple of that: within 0.1% (measured 3e-5). After it the runs' masters drift apart through
// the perturbed gradients (AdamW normalizes every step's update, so a small gradient change
// still moves each weight by up to lr): the steps stay within 2% (measured at most 1.05% over
// these 30 steps on the 2-core VM) and the mean within 0.5% (measured 0.08%). A quantizer that
// mixed up ranks, blocks or scales moves the loss by whole nats.
TEST(FsdpTrainQwz, Int8TracksFp32Loss) {
  const std::vector<nlohmann::json> fp = train("fp"), int8 = train("int8");
  ASSERT_EQ(fp.size(), size_t(kSteps));
  ASSERT_EQ(int8.size(), size_t(kSteps));
  const double first_fp = fp[0]["loss"].get<double>(), first_int8 = int8[0]["loss"].get<double>();
  EXPECT_NE(first_fp, first_int8) << "the int8 run gathered the exact weights";
  EXPECT_NEAR(first_int8, first_fp, 1e-3 * first_fp);
  double mean_fp = 0, mean_int8 = 0;
  for (int s = 0; s < kSteps; ++s) {
    const double a = fp[s]["loss"].get<double>(), b = int8[s]["loss"].get<double>();
    EXPECT_NEAR(b, a, 0.02 * a) << "step " << s + 1;
    mean_fp += a / kSteps;
    mean_int8 += b / kSteps;
  }
  EXPECT_NEAR(mean_int8, mean_fp, 5e-3 * mean_fp);
  // Training still learns: the last loss well below the first.
  EXPECT_LT(int8.back()["loss"].get<double>(), 0.9 * first_int8);
}

// Per gather of S elements per rank, int8 moves S + 4 ceil(S / 256) bytes per rank where fp32
// moves 4 S: the ratio lies in [1/4 + 1/256, 1/4 + 1/256 + 1/S_min] for the tiny model's units
// (S_min, the smallest unit's shard, is over 5,000 elements at W = 2).
TEST(FsdpTrainQwz, Int8MovesAQuarterOfTheBytesPlusTheScales) {
  const std::vector<nlohmann::json> fp = train("fp"), int8 = train("int8:256");
  ASSERT_FALSE(fp.empty());
  ASSERT_EQ(fp.size(), int8.size());
  for (size_t s = 0; s < fp.size(); ++s) {
    const double ratio = double(all_gather_bytes(int8[s])) / double(all_gather_bytes(fp[s]));
    EXPECT_GE(ratio, 0.25 + 1.0 / 256) << "step " << s + 1;
    EXPECT_LE(ratio, 0.25 + 1.0 / 256 + 1.0 / 5000) << "step " << s + 1;
  }
}

TEST(FsdpTrainQwz, CombinationsWithoutAnAllGatherAreRefused) {
  const std::string base = "--model tiny --steps 1 --global-batch 4 --all-gather int8 ";
  struct Refused {
    std::string args;
    std::string message;
  };
  const Refused cases[] = {
      {"--no-fsdp", "--no-fsdp has none"},
      {"--nproc 2 --strategy whole_tensor", "--strategy whole_tensor broadcasts whole tensors"},
      {"--nproc 2 --strategy no_shard",
       "--strategy no_shard on 2 rank(s) leaves a shard group of 1"},
      {"--nproc 1", "--strategy full_shard on 1 rank(s) leaves a shard group of 1"},
      {"--nproc 4 --strategy hybrid_shard --replicate 4",
       "--strategy hybrid_shard on 4 rank(s) leaves a shard group of 1"},
  };
  for (const Refused& c : cases) {
    const CommandResult r = run_fsdp_train(base + c.args, 60);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_THAT(r.output, HasSubstr(c.message)) << c.args;
  }
}

}  // namespace
}  // namespace fsdp::test
