// Elastic restarts that lose nothing: PyTorch's own torchrun restarts the group after a rank is
// killed (twice in one run), fsdp-train --resume auto picks up the last checkpoint, and the
// exported weights are byte-identical to an uninterrupted run's under the same launcher. A job
// that comes back at another world size reshards the checkpoint and ends within 1e-5 of the
// uninterrupted run.

#include "support/checkpoint_util.h"
#include "support/test_support.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace fsdp {
namespace {

using test::CommandResult;
using test::max_abs_difference;
using test::read_bytes;
using test::run_command;
using ::testing::HasSubstr;

const std::string kTrainFlags =
    " --steps 8 --global-batch 4 --seq-len 16 --seed 5 --log-every 100 --save-every 2 --resume "
    "auto";

std::string torchrun() {
  const std::string python = test::reference_python();
  return python.substr(0, python.rfind('/')) + "/torchrun";
}

// torchrun on 2 local ranks, restarting the group up to 3 times; its rendezvous port is the
// kernel's choice (--standalone).
std::string torchrun_train(const std::string& dir, const std::string& env) {
  return "env OMP_NUM_THREADS=1 " + env + " " + torchrun() +
         " --standalone --nproc-per-node 2 --max-restarts 3 --no-python " +
         test::fsdp_train_binary() + kTrainFlags + " --save " + dir + "/ckpt --export " + dir +
         "/model.safetensors";
}

TEST(ElasticRestartTest, TorchrunRestartsAfterTwoKillsAndTheWeightsAreByteIdentical) {
  const std::string dir = test::temp_dir("elastic");
  const CommandResult straight = run_command(torchrun_train(dir + "/straight", ""), 300);
  ASSERT_EQ(straight.exit_code, 0) << straight.output;

  // Rank 1 dies at the start of step 3 (after the step-2 save), rank 0 at step 6.
  const std::string kills = "FSDP_TRAIN_KILL_AT=3:1:" + dir + "/kill1," + "6:0:" + dir + "/kill2";
  const CommandResult restarted = run_command(torchrun_train(dir + "/restarted", kills), 300);
  ASSERT_EQ(restarted.exit_code, 0) << restarted.output;
  EXPECT_TRUE(test::exists(dir + "/kill1") && test::exists(dir + "/kill2")) << restarted.output;
  EXPECT_THAT(restarted.output, HasSubstr("resumed from"));
  EXPECT_EQ(read_bytes(dir + "/restarted/model.safetensors"),
            read_bytes(dir + "/straight/model.safetensors"));
  // For the record: the two exports' digests.
  std::cerr << run_command("sha256sum " + dir + "/straight/model.safetensors " + dir +
                               "/restarted/model.safetensors",
                           30)
                   .output;
}

TEST(ElasticRestartTest, RestartAtAnotherWorldSizeEndsWithinToleranceOfTheUninterruptedRun) {
  const std::string dir = test::temp_dir("elastic_world");
  const std::string train = test::fsdp_train_binary() + kTrainFlags + " --save " + dir;
  const CommandResult straight =
      run_command(test::fsdp_train_binary() + kTrainFlags + " --nproc 2 --save " + dir +
                  "/straight --export " + dir + "/straight.safetensors");
  ASSERT_EQ(straight.exit_code, 0) << straight.output;
  const CommandResult killed =
      run_command("env FSDP_TRAIN_KILL_AT=5:1:" + dir + "/kill " + train + "/ckpt --nproc 2");
  ASSERT_NE(killed.exit_code, 0) << killed.output;
  const CommandResult resumed =
      run_command(train + "/ckpt --nproc 4 --export " + dir + "/resumed.safetensors");
  ASSERT_EQ(resumed.exit_code, 0) << resumed.output;
  EXPECT_THAT(resumed.output, HasSubstr("at step 4 (saved by 2 ranks)"));
  const double diff =
      max_abs_difference(dir + "/straight.safetensors", dir + "/resumed.safetensors");
  EXPECT_LE(diff, 1e-5);
  std::cerr << "W=2 killed at step 5, resumed at W=4: max |difference| of the weights " << diff
            << "\n";
}

}  // namespace
}  // namespace fsdp
