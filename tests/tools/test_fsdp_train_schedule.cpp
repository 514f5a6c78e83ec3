// fsdp-train's held-out loss and learning-rate schedules, as real processes: the held-out loss
// of a sharded run is the single-process reference's, evaluating it leaves training untouched,
// every step's learning rate is the closed form computed here, and a resumed cosine run is the
// uninterrupted one bit for bit.
#include "support/test_support.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <string>
#include <vector>

namespace fsdp::train {
namespace {

using test::CommandResult;
using test::read_json_lines;
using test::run_fsdp_train;
using ::testing::HasSubstr;

std::string schedule_temp_path(const std::string& name) {
  return test::temp_path("fsdp_train_schedule_" + name);
}

const char* const kCommon = "--model tiny --global-batch 4 --seq-len 16 --quiet --seed 7";

TEST(FsdpTrainVal, ShardedValLossMatchesTheSingleProcessReference) {
  const std::string args = std::string(kCommon) + " --steps 4 --val-every 2 --val-batches 3";
  const std::string sharded = schedule_temp_path("val_w2.jsonl");
  const std::string reference = schedule_temp_path("val_w1.jsonl");
  const CommandResult a = run_fsdp_train("--nproc 2 " + args + " --metrics " + sharded);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const CommandResult b = run_fsdp_train("--no-fsdp " + args + " --metrics " + reference);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const auto got = read_json_lines(sharded);
  const auto want = read_json_lines(reference);
  ASSERT_EQ(got.size(), 4u);
  ASSERT_EQ(want.size(), 4u);
  for (size_t s = 0; s < got.size(); ++s) {
    const bool evaluated = (s + 1) % 2 == 0;
    ASSERT_EQ(got[s].contains("val_loss"), evaluated) << "step " << s + 1;
    ASSERT_EQ(want[s].contains("val_loss"), evaluated) << "step " << s + 1;
    if (!evaluated) continue;
    const double loss = got[s]["val_loss"], ref = want[s]["val_loss"];
    EXPECT_GT(ref, 0.5);
    EXPECT_NEAR(loss, ref, 1e-5 * ref) << "step " << s + 1;
  }
  // Training lowers the evaluation loss of the embedded corpus's last 10%.
  EXPECT_LT(want[3]["val_loss"].get<double>(), want[1]["val_loss"].get<double>() + 1e-9);
}

TEST(FsdpTrainVal, EvaluatingLeavesTrainingBitIdentical) {
  const std::string args = std::string(kCommon) + " --nproc 2 --steps 4";
  const std::string with = schedule_temp_path("with_val.jsonl");
  const std::string without = schedule_temp_path("without_val.jsonl");
  const CommandResult a = run_fsdp_train(args + " --val-every 1 --metrics " + with);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const CommandResult b = run_fsdp_train(args + " --metrics " + without);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const auto x = read_json_lines(with);
  const auto y = read_json_lines(without);
  ASSERT_EQ(x.size(), 4u);
  ASSERT_EQ(y.size(), 4u);
  for (size_t s = 0; s < x.size(); ++s) {
    EXPECT_TRUE(x[s].contains("val_loss")) << "step " << s + 1;
    EXPECT_EQ(x[s]["loss"].get<double>(), y[s]["loss"].get<double>()) << "step " << s + 1;
    EXPECT_EQ(x[s]["grad_norm"].get<double>(), y[s]["grad_norm"].get<double>());
  }
  // Only the last step of the run without --val-every is evaluated (the default held-out data).
  EXPECT_EQ(x[3]["val_loss"].get<double>(), y[3]["val_loss"].get<double>());
  EXPECT_FALSE(y[2].contains("val_loss"));
}

// The closed forms of fsdp/train/lr_schedule.h, written out again here.
double expected_lr(const std::string& kind, int64_t step, int64_t steps, int64_t warmup,
                   double peak, double min_lr, double decay_frac) {
  if (step < warmup) return peak * double(step + 1) / double(warmup);
  if (kind == "cosine") {
    const double p = double(step - warmup) / double(steps - warmup);
    return min_lr + 0.5 * (peak - min_lr) * (1 + std::cos(std::acos(-1.0) * p));
  }
  if (kind == "wsd") {
    const int64_t decay = std::llround(decay_frac * steps);
    if (step < steps - decay) return peak;
    return peak - (peak - min_lr) * double(step - (steps - decay) + 1) / double(decay);
  }
  return peak;
}

TEST(FsdpTrainSchedule, EveryStepsRateIsTheClosedForm) {
  const int64_t steps = 10, warmup = 3;
  const double peak = 2e-3, min_lr = 1e-4, decay_frac = 0.4;
  for (const std::string kind : {"constant", "cosine", "wsd"}) {
    const std::string metrics = schedule_temp_path("lr_" + kind + ".jsonl");
    const CommandResult r = run_fsdp_train(
        "--no-fsdp --model tiny --global-batch 2 --seq-len 8 --quiet --steps 10 --lr 2e-3 "
        "--warmup-steps 3 --min-lr 1e-4 --decay-frac 0.4 --lr-schedule " +
        kind + " --metrics " + metrics);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const auto lines = read_json_lines(metrics);
    ASSERT_EQ(lines.size(), size_t(steps));
    for (int64_t s = 0; s < steps; ++s) {
      const double want = expected_lr(kind, s, steps, warmup, peak, min_lr, decay_frac);
      EXPECT_NEAR(lines[s]["lr"].get<double>(), want, 1e-12 * peak) << kind << " step " << s + 1;
    }
    if (kind == "wsd") EXPECT_NEAR(lines.back()["lr"].get<double>(), min_lr, 1e-15);
    if (kind == "constant") EXPECT_EQ(lines.back()["lr"].get<double>(), peak);
  }
}

TEST(FsdpTrainSchedule, ResumedCosineRunIsBitIdentical) {
  const std::string root = schedule_temp_path("cosine_ckpt");
  const std::string args =
      std::string(kCommon) +
      " --nproc 2 --steps 4 --lr-schedule cosine --warmup-steps 1 --min-lr 1e-4";
  const std::string straight = schedule_temp_path("cosine_straight.jsonl");
  const CommandResult a =
      run_fsdp_train(args + " --save " + root + " --save-every 2 --metrics " + straight);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const std::string resumed = schedule_temp_path("cosine_resumed.jsonl");
  const CommandResult b =
      run_fsdp_train(args + " --resume " + root + "/step_00000002 --metrics " + resumed);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const auto x = read_json_lines(straight);
  const auto y = read_json_lines(resumed);
  ASSERT_EQ(x.size(), 4u);
  ASSERT_EQ(y.size(), 2u);
  for (size_t s = 0; s < 2; ++s) {
    EXPECT_EQ(y[s]["step"], x[s + 2]["step"]);
    EXPECT_EQ(y[s]["lr"].get<double>(), x[s + 2]["lr"].get<double>());
    EXPECT_EQ(y[s]["loss"].get<double>(), x[s + 2]["loss"].get<double>()) << "step " << s + 3;
    EXPECT_EQ(y[s]["grad_norm"].get<double>(), x[s + 2]["grad_norm"].get<double>());
  }
  EXPECT_EQ(y[1]["val_loss"].get<double>(), x[3]["val_loss"].get<double>());

  // A different schedule, or different data, would not continue that run: refused.
  const CommandResult wsd = run_fsdp_train(
      std::string(kCommon) + " --nproc 2 --steps 4 --lr-schedule wsd --resume " + root);
  EXPECT_NE(wsd.exit_code, 0);
  EXPECT_THAT(wsd.output, HasSubstr("learning-rate schedule"));
  const std::string text = schedule_temp_path("other.txt");
  {
    FILE* f = std::fopen(text.c_str(), "w");
    ASSERT_NE(f, nullptr);
    for (int i = 0; i < 50; ++i) std::fputs("some other training text. ", f);
    std::fclose(f);
  }
  const CommandResult other = run_fsdp_train(args + " --data " + text + " --resume " + root);
  EXPECT_NE(other.exit_code, 0);
  EXPECT_THAT(other.output, HasSubstr("--data"));
}

// Weight decay on matrices only (two param groups) on every rank, so a sharded run matches the
// single process; --decay-all changes training (biases and norm weights decay too). The FSDP2
// parity cases hold both groupings to PyTorch's.
TEST(FsdpTrainSchedule, DecayGroupsMatchTheSingleProcess) {
  const std::string args = std::string(kCommon) + " --steps 3 --weight-decay 0.5";
  const std::string sharded = schedule_temp_path("decay_w2.jsonl");
  const std::string reference = schedule_temp_path("decay_w1.jsonl");
  const std::string all = schedule_temp_path("decay_all.jsonl");
  const CommandResult a = run_fsdp_train("--nproc 2 " + args + " --metrics " + sharded);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const CommandResult b = run_fsdp_train("--no-fsdp " + args + " --metrics " + reference);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const CommandResult c = run_fsdp_train("--no-fsdp " + args + " --decay-all --metrics " + all);
  ASSERT_EQ(c.exit_code, 0) << c.output;
  const auto x = read_json_lines(sharded);
  const auto y = read_json_lines(reference);
  const auto z = read_json_lines(all);
  ASSERT_EQ(x.size(), 3u);
  ASSERT_EQ(y.size(), 3u);
  ASSERT_EQ(z.size(), 3u);
  for (size_t s = 0; s < 3; ++s) {
    const double loss = x[s]["loss"], ref = y[s]["loss"];
    EXPECT_NEAR(loss, ref, 1e-5 * ref) << "step " << s + 1;
  }
  // Step 1 is before any update; from step 2 on the decay of biases and norm weights shows.
  EXPECT_EQ(y[0]["loss"].get<double>(), z[0]["loss"].get<double>());
  EXPECT_NE(y[2]["loss"].get<double>(), z[2]["loss"].get<double>());
}

}  // namespace
}  // namespace fsdp::train
