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

#include <unistd.h>

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

// Rank 0 is killed at each later point of publishing the step-4 save: part-way through
// metadata.json, after the directory was renamed into place, and after the new `latest` was
// written but before its rename. In each case `latest` still names step 2, and resuming from
// the root reproduces the uninterrupted run.
TEST(CheckpointProcesses, SigkillWhilePublishingLeavesThePreviousCheckpointLoadable) {
  const std::string dir = temp_dir("sigkill_publish");
  const std::string common =
      fsdp_train_binary() + " --nproc 2 --steps 4 --global-batch 4 --seq-len 16 --seed 3 --quiet";
  const CommandResult straight = run_command(common + " --metrics " + dir + "/straight.jsonl");
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const auto want = losses(dir + "/straight.jsonl");

  for (const std::string phase : {"metadata:200", "rename", "latest"}) {
    const std::string root = dir + "/ckpt_" + phase.substr(0, phase.find(':'));
    const CommandResult crashed = run_command("env FSDP_CHECKPOINT_KILL_AT=4:0:" + phase + " " +
                                              common + " --save " + root + " --save-every 2");
    EXPECT_NE(crashed.exit_code, 0) << crashed.output;
    EXPECT_THAT(crashed.output, HasSubstr("rank 0 of 2 was killed by signal")) << phase;
    EXPECT_EQ(read_bytes(root + "/latest"), "step_00000002\n") << phase;
    // Only the rename phase got as far as putting step 4 in place (complete, but unnamed).
    EXPECT_EQ(exists(root + "/step_00000004"), phase != "metadata:200") << phase;

    const std::string metrics = root + "-resumed.jsonl";
    const CommandResult resumed =
        run_command(common + " --resume " + root + " --metrics " + metrics + " --save " + root);
    ASSERT_EQ(resumed.exit_code, 0) << phase << "\n" << resumed.output;
    const auto got = losses(metrics);
    ASSERT_EQ(got.size(), 2u) << phase;
    for (const auto& [step, loss] : got)
      EXPECT_EQ(loss, want.at(step)) << phase << " step " << step;
    EXPECT_EQ(read_bytes(root + "/latest"), "step_00000004\n") << phase;
  }
}

// Runs a shell command that must succeed (mount, umount), returning its output.
CommandResult must_run(const std::string& command) {
  CommandResult r = run_command(command, 30);
  EXPECT_EQ(r.exit_code, 0) << command << "\n" << r.output;
  return r;
}

// The step-4 save runs out of space on a file system sized for one and a half checkpoints.
// The error names the file system as full and the file; step 2's checkpoint and `latest` stay
// intact, and the run resumes from them exactly.
TEST(DiskFullTest, SaveOnAFullFileSystemFailsClearlyAndKeepsThePreviousCheckpoint) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a small tmpfs needs root";
  const std::string dir = temp_dir("disk_full");
  const std::string common =
      fsdp_train_binary() + " --nproc 2 --steps 4 --global-batch 4 --seq-len 16 --seed 3 --quiet";
  const CommandResult straight = run_command(common + " --metrics " + dir + "/straight.jsonl" +
                                             " --save " + dir + "/sized --save-every 2");
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const auto want = losses(dir + "/straight.jsonl");
  const int64_t one_kb =
      std::stoll(must_run("du -sk " + dir + "/sized/step_00000002 | cut -f1").output);

  const std::string mount_point = dir + "/small";
  must_run("mkdir -p " + mount_point);
  const CommandResult mounted = run_command(
      "mount -t tmpfs -o size=" + std::to_string(one_kb * 3 / 2 + 8) + "k tmpfs " + mount_point,
      30);
  if (mounted.exit_code != 0) GTEST_SKIP() << "cannot mount a tmpfs here: " << mounted.output;
  const std::string root = mount_point + "/ckpt";
  const CommandResult full = run_command(common + " --save " + root + " --save-every 2");
  const std::string latest = read_bytes(root + "/latest");
  const CommandResult resumed =
      run_command(common + " --resume " + root + " --metrics " + dir + "/resumed.jsonl");
  must_run("umount " + mount_point);

  EXPECT_NE(full.exit_code, 0) << full.output;
  EXPECT_THAT(full.output, HasSubstr("the file system is full")) << full.output;
  EXPECT_THAT(full.output, HasSubstr(".tmp-step_00000004/")) << full.output;
  EXPECT_EQ(latest, "step_00000002\n");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  const auto got = losses(dir + "/resumed.jsonl");
  ASSERT_EQ(got.size(), 2u);
  for (const auto& [step, loss] : got) EXPECT_EQ(loss, want.at(step)) << "step " << step;
  std::cerr << "disk full: " << full.output << "\n";
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

at::Tensor logits_of(const std::string& model_file, const at::Tensor& input_ids) {
  models::GPT2LMHead model(models::GPT2Config::tiny());
  load_full(model_file, *model, nullptr, models::gpt2_hf_layout());
  return model->forward(input_ids).detach();
}

TEST(CheckpointProcesses, TransformersLoadsOurExportAndWeLoadTheirs) {
  for (const char* package : {"transformers", "safetensors", "torch"}) {
    ASSERT_NE(test::installed_version(test::reference_python(), package), "")
        << "the Hugging Face interop test needs " << package << " in " << test::reference_python()
        << " (set FSDP_PYTHON to another interpreter, or run: " << test::reference_python()
        << " -m pip install transformers safetensors; scripts/run.sh test installs them)";
  }

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

  // transformers' side, cached by our export's bytes (support/reference_cache.h).
  const test::ReferenceResult checked = test::run_reference(
      test::reference_python(),
      {FSDP_SOURCE_DIR "/tests/checkpoint/hf_interop.py", ours + " " + theirs, {ours}, {theirs}});
  ASSERT_EQ(checked.exit_code, 0) << checked.output;
  EXPECT_THAT(checked.output, HasSubstr("no missing or unexpected keys"));

  const auto expected = load_safetensors(theirs + "/expected.safetensors");
  const at::Tensor got = logits_of(theirs + "/model.safetensors", expected.at("input_ids"));
  const double diff = (got - expected.at("logits")).abs().max().item<double>();
  EXPECT_LE(diff, 1e-5) << "logits of the transformers-written file, computed by our model";
}

}  // namespace
}  // namespace fsdp::checkpoint
