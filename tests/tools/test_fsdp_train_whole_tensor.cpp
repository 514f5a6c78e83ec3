// fsdp-train --strategy whole_tensor (inter-tensor ZeRO-3) as real processes:
// - 3 ranks match the --no-fsdp reference step by step; each rank's parameters, gradients and
//   AdamW state are the bytes it owns (together: the model once, no padding); fsdp-estimate
//   predicts those bytes, the broadcast and reduce payloads and the peak of unsharded bytes
//   exactly, also with bf16 compute and evenness priority 0;
// - its checkpoints reshard: saved whole-tensor at W = 4 and resumed full_shard at W = 2, and the
//   reverse, both end within 1e-5 of an uninterrupted whole-tensor run (whose export is itself
//   within 1e-5 of an uninterrupted full_shard run), and an export loaded with --init-from
//   exports again byte for byte;
// - a stalled rank ends the job at the timeout, naming the broadcast and the rank;
// - flags that do not apply to it are refused, naming them.

#include "support/checkpoint_util.h"
#include "support/test_support.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

namespace fsdp {
namespace {

using test::CommandResult;
using test::max_abs_difference;
using test::read_json_lines;
using test::run_command;
using test::run_fsdp_train;
using ::testing::HasSubstr;

// What one fsdp-train run here may take before it counts as hung.
constexpr int kTrainLimitS = 300;

TEST(FsdpTrainWholeTensor, ThreeRanksMatchTheReferenceAndTheEstimate) {
  const std::string common =
      " --model tiny --steps 4 --global-batch 6 --seq-len 16 --quiet --seed 3 --metrics ";
  const std::string whole = test::temp_path("whole.jsonl");
  const std::string reference = test::temp_path("whole_reference.jsonl");
  const CommandResult a =
      run_fsdp_train("--nproc 3 --strategy whole_tensor" + common + whole, kTrainLimitS);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const CommandResult b = run_fsdp_train("--no-fsdp" + common + reference, kTrainLimitS);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const CommandResult e = run_command(
      test::program_path("fsdp-estimate") +
          " --model tiny --world-size 3 --strategy whole_tensor --global-batch 6 --seq-len 16",
      60);
  ASSERT_EQ(e.exit_code, 0) << e.output;
  const auto estimate = nlohmann::json::parse(e.output.substr(e.output.find('{')));
  const auto got = read_json_lines(whole);
  const auto want = read_json_lines(reference);
  ASSERT_EQ(got.size(), 4u);
  ASSERT_EQ(want.size(), 4u);
  for (size_t s = 0; s < got.size(); ++s) {
    const double loss = got[s]["loss"], ref_loss = want[s]["loss"];
    const double norm = got[s]["grad_norm"], ref_norm = want[s]["grad_norm"];
    EXPECT_NEAR(loss, ref_loss, 1e-5 * ref_loss) << "step " << s + 1;
    EXPECT_NEAR(norm, ref_norm, 1e-5 * ref_norm) << "step " << s + 1;
    const int64_t model_bytes = want[s]["ranks"][0]["param_bytes"];
    int64_t together = 0, most = 0;
    size_t most_rank = 0;
    ASSERT_EQ(got[s]["ranks"].size(), 3u);
    for (size_t r = 0; r < 3; ++r) {
      const auto& rank = got[s]["ranks"][r];
      const int64_t owned = rank["param_bytes"];
      together += owned;
      if (owned > most) most = owned, most_rank = r;
      EXPECT_EQ(rank["grad_bytes"].get<int64_t>(), owned);
      EXPECT_EQ(rank["optim_bytes"].get<int64_t>(), 2 * owned);
      EXPECT_EQ(rank["all_gather_bytes"].get<int64_t>(), 0);
      EXPECT_EQ(rank["reduce_scatter_bytes"].get<int64_t>(), 0);
      // Every gradient byte is reduced once; blocks are broadcast twice, the root once.
      EXPECT_EQ(rank["reduce_bytes"].get<int64_t>(), model_bytes);
      EXPECT_GT(rank["broadcast_bytes"].get<int64_t>(), model_bytes);
      EXPECT_LT(rank["broadcast_bytes"].get<int64_t>(), 2 * model_bytes);
      EXPECT_EQ(rank["broadcast_bytes"], got[s]["ranks"][0]["broadcast_bytes"]);
      EXPECT_EQ(rank["broadcast_bytes"], estimate["broadcast_bytes"]);
      EXPECT_EQ(rank["reduce_bytes"], estimate["reduce_bytes"]);
    }
    EXPECT_EQ(together, model_bytes) << "the ranks own the model exactly once";
    const auto& largest = got[s]["ranks"][most_rank];
    EXPECT_EQ(largest["param_bytes"], estimate["param_bytes"]);
    EXPECT_EQ(largest["optim_bytes"], estimate["optim_bytes"]);
    EXPECT_EQ(largest["peak_unsharded_bytes"], estimate["peak_unsharded_bytes"]);
  }
}

TEST(FsdpTrainWholeTensor, EstimateIsExactWithBf16AndEvennessPriorityZero) {
  // bf16 copies of the owned tensors are materialized too; evenness priority 0 leaves ranks
  // uneven (one may own nothing): the estimate is the largest rank's.
  const std::string flags =
      " --model tiny --global-batch 8 --seq-len 16 --strategy whole_tensor --evenness-priority 0 "
      "--param-dtype bf16 --reduce-dtype fp32";
  const std::string metrics = test::temp_path("whole_bf16.jsonl");
  const CommandResult t =
      run_fsdp_train("--nproc 4 --steps 2 --quiet --metrics " + metrics + flags, kTrainLimitS);
  ASSERT_EQ(t.exit_code, 0) << t.output;
  const CommandResult e =
      run_command(test::program_path("fsdp-estimate") + " --world-size 4" + flags, 60);
  ASSERT_EQ(e.exit_code, 0) << e.output;
  const auto estimate = nlohmann::json::parse(e.output.substr(e.output.find('{')));
  const auto ranks = read_json_lines(metrics).back()["ranks"];
  nlohmann::json largest = ranks[0];
  for (const auto& r : ranks) {
    if (r["param_bytes"].get<int64_t>() > largest["param_bytes"].get<int64_t>()) largest = r;
  }
  for (const char* key : {"param_bytes", "grad_bytes", "optim_bytes", "peak_unsharded_bytes",
                          "broadcast_bytes", "reduce_bytes"}) {
    EXPECT_EQ(largest[key], estimate[key]) << key;
  }
}

TEST(FsdpTrainWholeTensor, CheckpointsReshardToFullShardAndBack) {
  // lr 1e-3, as the runtime's equivalence tests: AdamW amplifies float rounding, and at the
  // trainer's default 3e-3 full_shard alone at W = 4 and W = 2 ends 1.16e-5 apart after 6 steps.
  const std::string dir = test::temp_dir("whole_tensor_resume");
  const std::string flags =
      " --model tiny --global-batch 8 --seq-len 16 --seed 11 --lr 1e-3 --log-every 100 --steps 6";
  const CommandResult straight = run_fsdp_train(
      "--nproc 4 --strategy whole_tensor" + flags + " --export " + dir + "/straight.safetensors",
      kTrainLimitS);
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const CommandResult full_shard = run_fsdp_train(
      "--nproc 2" + flags + " --export " + dir + "/full_shard.safetensors", kTrainLimitS);
  ASSERT_EQ(full_shard.exit_code, 0) << full_shard.output;
  EXPECT_LE(max_abs_difference(dir + "/straight.safetensors", dir + "/full_shard.safetensors"),
            1e-5);

  // Whole-tensor at W = 4 for 3 steps, then full_shard at W = 2.
  const std::string first =
      " --model tiny --global-batch 8 --seq-len 16 --seed 11 --lr 1e-3 --steps 3";
  CommandResult r = run_fsdp_train(
      "--nproc 4 --strategy whole_tensor" + first + " --save " + dir + "/a", kTrainLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_fsdp_train("--nproc 2 --strategy full_shard" + flags + " --resume " + dir +
                         "/a --export " + dir + "/a.safetensors",
                     kTrainLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("at step 3 (saved by 4 ranks)"));
  const double to_full = max_abs_difference(dir + "/straight.safetensors", dir + "/a.safetensors");
  EXPECT_LE(to_full, 1e-5);

  // full_shard at W = 2 for 3 steps, then whole-tensor at W = 4.
  r = run_fsdp_train("--nproc 2" + first + " --save " + dir + "/b", kTrainLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_fsdp_train("--nproc 4 --strategy whole_tensor" + flags + " --resume " + dir +
                         "/b --export " + dir + "/b.safetensors",
                     kTrainLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("at step 3 (saved by 2 ranks)"));
  const double to_whole = max_abs_difference(dir + "/straight.safetensors", dir + "/b.safetensors");
  EXPECT_LE(to_whole, 1e-5);
  std::cerr << "whole_tensor W=4 -> full_shard W=2: max |difference| " << to_full
            << "; full_shard W=2 -> whole_tensor W=4: " << to_whole << "\n";
}

TEST(FsdpTrainWholeTensor, InitFromAnExportAndExportAgainGivesTheSameFile) {
  // load_full reads each tensor on its owner only; save_full broadcasts it from there to rank 0.
  const std::string dir = test::temp_dir("whole_tensor_export");
  const std::string flags = " --model tiny --global-batch 6 --seq-len 16 --seed 4 --quiet";
  CommandResult r = run_fsdp_train(
      "--nproc 2 --steps 2" + flags + " --export " + dir + "/a.safetensors", kTrainLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  r = run_fsdp_train("--nproc 3 --strategy whole_tensor --steps 0" + flags + " --init-from " + dir +
                         "/a.safetensors --export " + dir + "/b.safetensors",
                     kTrainLimitS);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(test::read_bytes(dir + "/a.safetensors"), test::read_bytes(dir + "/b.safetensors"));
}

TEST(FsdpTrainWholeTensor, AStalledRankEndsTheJobNamingTheBroadcastAndTheRank) {
  const CommandResult r = run_command(
      "env FSDP_TRAIN_STALL_AT=1:1 FSDP_FLIGHT_RECORDER_DIR=" + test::temp_dir("whole_stall") +
          " " + test::fsdp_train_binary() +
          " --nproc 2 --strategy whole_tensor --model tiny --steps 3 --global-batch 4 "
          "--seq-len 16 --quiet --timeout-s 3",
      60);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("broadcast timed out after 3000 ms waiting for rank 1"));
}

TEST(FsdpTrainWholeTensor, FlagsThatDoNotApplyAreRefused) {
  const std::string base = "--nproc 2 --model tiny --steps 1 --global-batch 4 --seq-len 8 ";
  const struct {
    std::string args, message;
  } cases[] = {
      {"--strategy whole_tensor --wrap-policy min-params:100",
       "--wrap-policy 'min-params:100' is not supported with it"},
      {"--strategy whole_tensor --reshard-after-forward 2",
       "--reshard-after-forward 2 (a group size) applies to --strategy full_shard and "
       "hybrid_shard, not whole_tensor"},
      {"--strategy whole_tensor --replicate 2", "--replicate 2 applies to --strategy hybrid_shard"},
      {"--evenness-priority 0.5", "--evenness-priority 0.5 applies to --strategy whole_tensor"},
      {"--strategy whole_tensor --evenness-priority 1.5", "--evenness-priority"},
      {"--strategy whole-tensor", "whole_tensor, got 'whole-tensor'"},
  };
  for (const auto& c : cases) {
    const CommandResult r = run_fsdp_train(base + c.args, 60);
    EXPECT_NE(r.exit_code, 0) << c.args;
    EXPECT_THAT(r.output, HasSubstr(c.message)) << c.args;
  }
  const CommandResult plan =
      run_command(test::program_path("fsdp-plan") + " --hardware " FSDP_SOURCE_DIR
                                                    "/bench/hardware/h100_sxm.json --world-size 4 "
                                                    "--model small --strategy whole_tensor",
                  60);
  EXPECT_NE(plan.exit_code, 0);
  EXPECT_THAT(plan.output, HasSubstr("whole_tensor is not modelled by the step-time planner"));
}

}  // namespace
}  // namespace fsdp
