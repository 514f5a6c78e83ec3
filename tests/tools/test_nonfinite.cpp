// The numerics guard of fsdp-train: a NaN injected into one rank's loss (FSDP_TRAIN_NAN_AT)
// stops every rank with an error naming the step, the rank and the first unit whose gradient is
// not finite; with --skip-nonfinite the step is skipped on every rank, which must leave the
// weights exactly as a run that stopped before that step left them.
#include "support/checkpoint_util.h"
#include "support/test_support.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

namespace fsdp {
namespace {

using test::CommandResult;
using test::run_command;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kFlags = " --nproc 2 --global-batch 4 --seq-len 16 --seed 7 --log-every 1";

TEST(NonFiniteTest, ANaNOnOneRankStopsEveryRankNamingStepRankAndUnit) {
  const CommandResult r =
      run_command("env FSDP_TRAIN_NAN_AT=3:1 " + test::fsdp_train_binary() + kFlags + " --steps 6");
  EXPECT_NE(r.exit_code, 0) << r.output;
  // tiny has two blocks: the second is the first unit backward reaches.
  EXPECT_THAT(r.output,
              HasSubstr("error: step 4: the loss is not finite on rank 1; gradient norm"));
  EXPECT_THAT(r.output, HasSubstr("the first unit in backward order with a non-finite gradient is "
                                  "'transformer.h.1' (on ranks 0, 1)"));
  EXPECT_THAT(r.output, Not(HasSubstr("step     4/6")));
}

TEST(NonFiniteTest, ASkippedStepLeavesTheWeightsOfTheStepBefore) {
  const std::string dir = test::temp_dir("nonfinite_skip");
  const CommandResult skipped =
      run_command("env FSDP_TRAIN_NAN_AT=3:1 " + test::fsdp_train_binary() + kFlags +
                  " --steps 4 --skip-nonfinite 1 --metrics " + dir + "/skipped.jsonl --export " +
                  dir + "/skipped.safetensors");
  ASSERT_EQ(skipped.exit_code, 0) << skipped.output;
  const CommandResult three = run_command(test::fsdp_train_binary() + kFlags +
                                          " --steps 3 --export " + dir + "/three.safetensors");
  ASSERT_EQ(three.exit_code, 0) << three.output;
  EXPECT_EQ(test::read_bytes(dir + "/skipped.safetensors"),
            test::read_bytes(dir + "/three.safetensors"));
  const auto lines = test::read_json_lines(dir + "/skipped.jsonl");
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[2]["skipped_steps"], 0);
  EXPECT_EQ(lines[3]["skipped_steps"], 1);
  EXPECT_THAT(skipped.output, HasSubstr("skipped step 4: the loss is not finite on rank 1"));
}

TEST(NonFiniteTest, TrainingStopsOnceTheAllowedSkipsAreUsedUp) {
  const CommandResult r = run_command("env FSDP_TRAIN_NAN_AT=1:0,3:1 " + test::fsdp_train_binary() +
                                      kFlags + " --steps 6 --skip-nonfinite 1");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("skipped step 2: the loss is not finite on rank 0"));
  EXPECT_THAT(r.output, HasSubstr("error: step 4: the loss is not finite on rank 1"));
  EXPECT_THAT(r.output, HasSubstr("stopping: --skip-nonfinite 1 steps were skipped already"));
}

}  // namespace
}  // namespace fsdp
