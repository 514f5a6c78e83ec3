// Checkpoints with real processes: fsdp-train ranks killed with SIGKILL in the middle of a save
// leave the previous checkpoint intact, and resuming from it reproduces the uninterrupted run;
// transformers loads our export (no missing or unexpected keys, same logits) and we load a
// file transformers wrote.
#include <fsdp/checkpoint/checkpoint.h>
#include <fsdp/checkpoint/safetensors.h>
#include <models/gpt2/gpt2.h>
#include <models/gpt2/hf.h>

#include "support/checkpoint_util.h"
#include "support/test_support.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#ifndef FSDP_SOURCE_DIR
#error "FSDP_SOURCE_DIR must name the source tree (tests/CMakeLists.txt defines it)"
#endif

namespace fsdp::checkpoint {
namespace {

using test::CommandResult;
using test::exists;
using test::file_size;
using test::fsdp_train_binary;
using test::read_bytes;
using test::run_command;
using test::temp_dir;
using ::testing::HasSubstr;

std::map<int64_t, double> losses(const std::string& metrics_path) {
  std::map<int64_t, double> result;
  std::ifstream in(metrics_path);
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    result[j["step"].get<int64_t>()] = j["loss"].get<double>();
  }
  return result;
}

TEST(CheckpointProcesses, SigkillMidSaveLeavesThePreviousCheckpointLoadable) {
  const std::string dir = temp_dir("sigkill");
  const std::string common =
      fsdp_train_binary() + " --nproc 2 --steps 4 --global-batch 4 --seq-len 16 --seed 3 --quiet";
  const CommandResult straight = run_command(common + " --metrics " + dir + "/straight.jsonl");
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const auto want = losses(dir + "/straight.jsonl");
  ASSERT_EQ(want.size(), 4u);

  for (int victim : {1, 0}) {
    const std::string root = dir + "/ckpt" + std::to_string(victim);
    // The rank dies 50,000 bytes into its file of the step-4 save; step 2's save completed.
    const CommandResult crashed =
        run_command("env FSDP_CHECKPOINT_KILL_AT=4:" + std::to_string(victim) + ":50000 " + common +
                    " --save " + root + " --save-every 2");
    EXPECT_NE(crashed.exit_code, 0) << crashed.output;
    EXPECT_THAT(crashed.output,
                HasSubstr("rank " + std::to_string(victim) + " of 2 was killed by signal"));
    EXPECT_EQ(read_bytes(root + "/latest"), "step_00000002\n");
    EXPECT_FALSE(exists(root + "/step_00000004"));
    const std::string partial =
        root + "/.tmp-step_00000004/rank_0000" + std::to_string(victim) + "-of-00002.safetensors";
    ASSERT_TRUE(exists(partial));
    EXPECT_EQ(file_size(partial), 50000);

    const std::string metrics = root + "-resumed.jsonl";
    const CommandResult resumed =
        run_command(common + " --resume " + root + " --metrics " + metrics + " --save " + root);
    ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
    const auto got = losses(metrics);
    ASSERT_EQ(got.size(), 2u);
    for (const auto& [step, loss] : got)
      EXPECT_EQ(loss, want.at(step)) << "victim " << victim << " step " << step;
    EXPECT_FALSE(exists(root + "/.tmp-step_00000004")) << "the next save removes the leftovers";
    EXPECT_EQ(read_bytes(root + "/latest"), "step_00000004\n");
  }
}

// --init-from loads an export into a model sharded over other ranks (each rank reads its rows)
// and --export writes it back: the same bytes, for fp32 and for a bf16 file read into fp32.
TEST(CheckpointProcesses, InitFromAnExportAndExportAgainGivesTheSameFile) {
  const std::string dir = temp_dir("init_from");
  const std::string common =
      fsdp_train_binary() + " --global-batch 6 --seq-len 16 --seed 4 --quiet";
  for (const std::string dtype : {"fp32", "bf16"}) {
    const std::string first = dir + "/trained_" + dtype + ".safetensors";
    const std::string again = dir + "/again_" + dtype + ".safetensors";
    CommandResult r =
        run_command(common + " --nproc 1 --steps 3 --export " + first + " --export-dtype " + dtype);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    r = run_command(common + " --nproc 3 --steps 0 --init-from " + first + " --export " + again +
                    " --export-dtype " + dtype);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_EQ(read_bytes(first), read_bytes(again)) << dtype;
  }
}

std::string python() { return test::reference_python(); }

at::Tensor logits_of(const std::string& model_file, const at::Tensor& input_ids) {
  models::GPT2LMHead model(models::GPT2Config::tiny());
  load_full(model_file, *model, nullptr, models::gpt2_hf_layout());
  return model->forward(input_ids).detach();
}

TEST(CheckpointProcesses, TransformersLoadsOurExportAndWeLoadTheirs) {
  const CommandResult probe =
      run_command(python() + " -c 'import transformers, safetensors, torch'", 120);
  ASSERT_EQ(probe.exit_code, 0)
      << "the Hugging Face interop test needs transformers and safetensors in " << python()
      << " (set FSDP_PYTHON to another interpreter, or run: " << python()
      << " -m pip install transformers safetensors; scripts/run.sh test installs them):\n"
      << probe.output;

  const std::string dir = temp_dir("hf");
  const std::string ours = dir + "/ours", theirs = dir + "/theirs";
  const CommandResult trained = run_command(
      fsdp_train_binary() + " --nproc 2 --steps 3 --global-batch 4 --seq-len 16 --quiet --export " +
      ours + "/model.safetensors");
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  ASSERT_TRUE(exists(ours + "/config.json"));
  const at::Tensor input_ids = (at::arange(2 * 24).reshape({2, 24}) * 37 + 11).remainder(256);
  save_safetensors(
      ours + "/expected.safetensors",
      {{"input_ids", input_ids}, {"logits", logits_of(ours + "/model.safetensors", input_ids)}});

  const CommandResult checked = run_command(
      python() + " " FSDP_SOURCE_DIR "/tests/checkpoint/hf_interop.py " + ours + " " + theirs, 300);
  ASSERT_EQ(checked.exit_code, 0) << checked.output;
  EXPECT_THAT(checked.output, HasSubstr("no missing or unexpected keys"));

  const auto expected = load_safetensors(theirs + "/expected.safetensors");
  const at::Tensor got = logits_of(theirs + "/model.safetensors", expected.at("input_ids"));
  const double diff = (got - expected.at("logits")).abs().max().item<double>();
  EXPECT_LE(diff, 1e-5) << "logits of the transformers-written file, computed by our model";
}

}  // namespace
}  // namespace fsdp::checkpoint
