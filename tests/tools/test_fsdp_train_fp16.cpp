// fsdp-train --param-dtype fp16: dynamic loss scaling over the sharded gradients
// (fsdp/grad_scaler.h).
//
// - An overflow injected into one rank's gradient shard (FSDP_TRAIN_OVERFLOW_AT) skips the step on
//   every rank (the weights equal those of a run that stopped before the step, bit for bit),
//   counts in skipped_steps and halves the loss scale.
// - fp16 at W = 4 follows the fp32 run's loss within 3% over 200 steps of tiny.
// - W = 1 and W = 2 agree: the same loss scales and skipped steps, losses within fp16 rounding.
// - The scale and the growth tracker are in checkpoints and survive a resume, at the same world
//   size (bit for bit) and at another.
#include "support/checkpoint_util.h"
#include "support/test_support.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace fsdp {
namespace {

using test::CommandResult;
using test::run_command;
using ::testing::HasSubstr;

const std::string kFlags = " --seed 7 --quiet --val-every 0";
const std::string kSmall = " --global-batch 8 --seq-len 32 ";

// Small batches unless the flags give --global-batch.
std::string train(int world, const std::string& flags) {
  const bool own_batch = flags.find("--global-batch") != std::string::npos;
  return test::fsdp_train_binary() + " --nproc " + std::to_string(world) + kFlags +
         (own_batch ? " " : kSmall) + flags;
}

std::vector<nlohmann::json> run_metrics(const std::string& command, const std::string& metrics) {
  const CommandResult r = run_command(command + " --metrics " + metrics, 600);
  EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.output;
  return test::read_json_lines(metrics);
}

// The spacing of fp16 numbers around x (x normal): the unit of an fp16 run's rounding.
double fp16_spacing(double x) { return std::ldexp(1.0, std::ilogb(x) - 10); }

// Losses of two fp16 runs whose weights differ only by the rounding of their fp16 reductions
// (W = 1 rounds the whole batch's gradient to fp16, W = 2 each half before the sum, W = 4 each
// quarter): over a few dozen steps that moves the fp16 loss by a couple of spacings (measured:
// 2 at W = 1 vs 2 over 20 steps). 4 allows it; a real fault is far off: one update missed
// early on moves it by dozens of spacings (measured: two skipped updates, about 100).
void expect_within_fp16_rounding(double a, double b, const std::string& where) {
  EXPECT_LE(std::abs(a - b), 4 * fp16_spacing(std::max(a, b))) << where << ": " << a << " vs " << b;
}

nlohmann::json checkpoint_scaler(const std::string& checkpoint_dir) {
  std::ifstream in(checkpoint_dir + "/metadata.json");
  std::stringstream text;
  text << in.rdbuf();
  const auto index = nlohmann::json::parse(text.str(), nullptr, false);
  return index.is_object() && index.contains("grad_scaler") ? index["grad_scaler"]
                                                            : nlohmann::json();
}

TEST(Fp16Train, AnInjectedOverflowSkipsTheStepOnEveryRankAndHalvesTheScale) {
  const std::string dir = test::temp_dir("fp16_overflow");
  // Step 4 (0-based 3) overflows on rank 1 only.
  const auto lines = run_metrics("env FSDP_TRAIN_OVERFLOW_AT=3:1 " +
                                     train(2, "--param-dtype fp16 --steps 4 --save " + dir +
                                                  "/ckpt --export " + dir + "/skipped.safetensors"),
                                 dir + "/skipped.jsonl");
  ASSERT_EQ(lines.size(), 4u);
  const CommandResult three =
      run_command(train(2, "--param-dtype fp16 --steps 3 --export " + dir + "/three.safetensors"));
  ASSERT_EQ(three.exit_code, 0) << three.output;
  // No rank updated anything at step 4: the gathered weights are those after step 3.
  EXPECT_EQ(test::read_bytes(dir + "/skipped.safetensors"),
            test::read_bytes(dir + "/three.safetensors"));
  EXPECT_EQ(lines[3]["skipped_steps"].get<int64_t>(), lines[2]["skipped_steps"].get<int64_t>() + 1);
  // The step ran at the scale of the step before (no growth within 2000 steps), and left it
  // halved for the next one.
  const double scale = lines[3]["loss_scale"];
  EXPECT_EQ(scale, lines[2]["loss_scale"].get<double>());
  const nlohmann::json saved = checkpoint_scaler(dir + "/ckpt/step_00000004");
  ASSERT_TRUE(saved.is_object()) << "no grad_scaler in the checkpoint";
  EXPECT_EQ(saved["scale"].get<double>(), scale / 2);
  EXPECT_EQ(saved["growth_tracker"], 0);
}

TEST(Fp16Train, Fp16AtW4TracksFp32WithinThreePercentOver200Steps) {
  const std::string dir = test::temp_dir("fp16_tracks");
  // 8 x 32 tokens a step (each rank 2 sequences), so that the two runs take about 45 s together
  // on CI's 2 cores. The initial scale is one at which tiny's gradients do not overflow, so
  // that every step compares like with like (the skips are AnInjectedOverflow's and
  // Fsdp2Parity.Fp16*'s). The runs part over rounding where the loss curve is rough: with the
  // loss computed in float32 (models::loss), the fp16 run matches fp32 to 1e-4 for 40 steps,
  // then both runs' gradient norms spike at step 45 and the fp16 loss differs by up to 2.3%
  // (step 51), within 1% after step 55.
  const auto fp32 = run_metrics(train(4, "--steps 200"), dir + "/fp32.jsonl");
  const auto fp16 = run_metrics(train(4, "--steps 200 --param-dtype fp16 --init-scale 8192"),
                                dir + "/fp16.jsonl");
  ASSERT_EQ(fp32.size(), 200u);
  ASSERT_EQ(fp16.size(), 200u);
  // Every step's loss within 3% (measured: 2.3%).
  double worst = 0;
  for (size_t s = 0; s < fp32.size(); ++s) {
    const double a = fp16[s]["loss"], b = fp32[s]["loss"];
    worst = std::max(worst, std::abs(a - b) / b);
    EXPECT_LE(std::abs(a - b) / b, 0.03) << "step " << s + 1 << ": fp16 " << a << ", fp32 " << b;
    EXPECT_EQ(fp16[s]["loss_scale"], 8192.0) << "step " << s + 1;
  }
  EXPECT_EQ(fp16.back()["skipped_steps"], 0);
  std::cout << "[fp16] worst relative loss difference to fp32 over 200 steps: " << worst << "\n";
}

TEST(Fp16Train, W1AndW2AgreeWithinFp16Rounding) {
  const std::string dir = test::temp_dir("fp16_w1_w2");
  const std::string flags = "--param-dtype fp16 --steps 20 --growth-interval 5";
  const auto w1 = run_metrics(train(1, flags), dir + "/w1.jsonl");
  const auto w2 = run_metrics(train(2, flags), dir + "/w2.jsonl");
  ASSERT_EQ(w1.size(), 20u);
  ASSERT_EQ(w2.size(), 20u);
  double worst = 0;
  for (size_t s = 0; s < w1.size(); ++s) {
    // The scaler's decisions are exact: a rounding difference that flipped one would show here.
    EXPECT_EQ(w1[s]["loss_scale"], w2[s]["loss_scale"]) << "step " << s + 1;
    EXPECT_EQ(w1[s]["skipped_steps"], w2[s]["skipped_steps"]) << "step " << s + 1;
    const double a = w1[s]["loss"], b = w2[s]["loss"];
    expect_within_fp16_rounding(a, b, "step " + std::to_string(s + 1));
    worst = std::max(worst, std::abs(a - b) / fp16_spacing(std::max(a, b)));
  }
  std::cout << "[fp16] worst loss difference W = 1 vs 2: " << worst << " fp16 spacings\n";
  // Growth and backoff both took part in the comparison.
  int grew = 0, backed_off = 0;
  for (size_t s = 1; s < w1.size(); ++s) {
    const double before = w1[s - 1]["loss_scale"], now = w1[s]["loss_scale"];
    grew += now > before ? 1 : 0;
    backed_off += now < before ? 1 : 0;
  }
  EXPECT_GE(grew, 1);
  EXPECT_GE(backed_off, 1);
}

// Under --tp 2 each rank of a tp group holds other slices of the split layers, so an overflow in
// one rank's slice must skip the step on its tp peers too (the scaler sums found_inf over the
// tp group of split parameters; with dp = 1 there is no FSDP group to carry it). Then the whole
// scaler run against one process: the same scales and skips, losses within fp16 rounding.
TEST(Fp16Train, UnderTensorParallelismAnOverflowOnOneRankSkipsTheStepEverywhere) {
  const std::string dir = test::temp_dir("fp16_tp");
  const auto lines = run_metrics(
      "env FSDP_TRAIN_OVERFLOW_AT=3:1 " +
          train(2, "--tp 2 --param-dtype fp16 --steps 4 --export " + dir + "/skipped.safetensors"),
      dir + "/skipped.jsonl");
  ASSERT_EQ(lines.size(), 4u);
  const CommandResult three = run_command(
      train(2, "--tp 2 --param-dtype fp16 --steps 3 --export " + dir + "/three.safetensors"));
  ASSERT_EQ(three.exit_code, 0) << three.output;
  EXPECT_EQ(test::read_bytes(dir + "/skipped.safetensors"),
            test::read_bytes(dir + "/three.safetensors"));
  EXPECT_EQ(lines[3]["skipped_steps"].get<int64_t>(), lines[2]["skipped_steps"].get<int64_t>() + 1);

  const std::string flags = "--param-dtype fp16 --steps 20 --growth-interval 5";
  const auto one = run_metrics(train(1, flags), dir + "/one.jsonl");
  const auto tp = run_metrics(train(2, flags + " --tp 2"), dir + "/tp.jsonl");
  ASSERT_EQ(one.size(), 20u);
  ASSERT_EQ(tp.size(), 20u);
  for (size_t s = 0; s < one.size(); ++s) {
    EXPECT_EQ(one[s]["loss_scale"], tp[s]["loss_scale"]) << "step " << s + 1;
    EXPECT_EQ(one[s]["skipped_steps"], tp[s]["skipped_steps"]) << "step " << s + 1;
    expect_within_fp16_rounding(one[s]["loss"], tp[s]["loss"], "step " + std::to_string(s + 1));
  }
  EXPECT_GE(tp.back()["skipped_steps"].get<int64_t>(), 1);  // backoff took part
}

TEST(Fp16Train, TheScaleAndGrowthTrackerSurviveAResumeAtAnyWorldSize) {
  const std::string dir = test::temp_dir("fp16_resume");
  // At a scale that never overflows at W = 2 or 4 (the loss runs in float32, so the default
  // 2^16 would not overflow at first either, but W = 4 overflows at 2^17 where W = 2 does not,
  // and a skip that only one world size takes would end the comparison), growing every 2 steps.
  const std::string flags = "--param-dtype fp16 --steps 6 --growth-interval 2 --init-scale 8192";
  const auto whole = run_metrics(train(2, flags + " --save " + dir +
                                              "/ckpt --save-every 3 "
                                              "--export " +
                                              dir + "/whole/model.safetensors"),
                                 dir + "/whole.jsonl");
  ASSERT_EQ(whole.size(), 6u);
  // The checkpoint at step 3 holds the scale step 4 ran at, and a growth tracker mid-interval
  // (else a resume that lost it would go unnoticed: here it grows the scale after step 4).
  const nlohmann::json saved = checkpoint_scaler(dir + "/ckpt/step_00000003");
  ASSERT_TRUE(saved.is_object()) << "no grad_scaler in the checkpoint";
  EXPECT_EQ(saved["scale"].get<double>(), whole[3]["loss_scale"].get<double>());
  EXPECT_GT(saved["growth_tracker"].get<int64_t>(), 0);

  for (const int world : {2, 4}) {
    const std::string name = "w" + std::to_string(world);
    const auto resumed =
        run_metrics(train(world, flags + " --resume " + dir + "/ckpt/step_00000003 --export " +
                                     dir + "/" + name + "/model.safetensors"),
                    dir + "/" + name + ".jsonl");
    ASSERT_EQ(resumed.size(), 3u) << name;
    for (size_t s = 0; s < resumed.size(); ++s) {
      const nlohmann::json& want = whole[3 + s];
      EXPECT_EQ(resumed[s]["step"], want["step"]);
      EXPECT_EQ(resumed[s]["loss_scale"], want["loss_scale"]) << name << " step " << want["step"];
      EXPECT_EQ(resumed[s]["skipped_steps"], want["skipped_steps"]) << name;
      if (world == 2) {
        EXPECT_EQ(resumed[s]["loss"], want["loss"]) << "step " << want["step"];
      } else {  // other fp16 reductions after the resume
        expect_within_fp16_rounding(resumed[s]["loss"], want["loss"],
                                    name + " step " + want["step"].dump());
      }
    }
  }
  EXPECT_EQ(test::read_bytes(dir + "/w2/model.safetensors"),
            test::read_bytes(dir + "/whole/model.safetensors"));
}

TEST(Fp16Train, AResumeWithOtherScalerSettingsIsRefused) {
  const std::string dir = test::temp_dir("fp16_resume_refused");
  const CommandResult saved =
      run_command(train(2, "--param-dtype fp16 --steps 2 --save " + dir + "/ckpt"));
  ASSERT_EQ(saved.exit_code, 0) << saved.output;
  const CommandResult r = run_command(
      train(2, "--param-dtype fp16 --steps 4 --growth-interval 7 --resume " + dir + "/ckpt"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("the checkpoint's gradient scaler has growth factor 2, backoff "
                                  "factor 0.5 and growth interval 2000, this run's 2, 0.5 and 7"));
}

}  // namespace
}  // namespace fsdp
