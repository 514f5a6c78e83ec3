// The checkpoint manager (fsdp/train/checkpoint_manager.h) in one process: saves fall due every
// N steps, only the newest K stay, "auto" resumes from the newest (or starts fresh when there is
// none) with the parameters, the optimizer state and the user JSON of the save, and the final
// save is skipped only when the last periodic one already holds it.
#include <fsdp/train/checkpoint_manager.h>

#include "support/files.h"
#include "support/test_support.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <string>
#include <vector>

namespace fsdp::train {
namespace {

// A model and its optimizer after `steps` AdamW steps on a fixed batch.
struct Trained {
  explicit Trained(int steps) : model(4, 3), optimizer(model->parameters()) {
    at::manual_seed(0);
    for (auto& p : model->parameters()) p.data().copy_(at::randn(p.sizes()));
    const at::Tensor x = at::arange(8, at::kFloat).view({2, 4}) / 8;
    for (int i = 0; i < steps; ++i) {
      optimizer.zero_grad();
      model->forward(x).square().sum().backward();
      optimizer.step();
    }
  }
  torch::nn::Linear model;
  torch::optim::AdamW optimizer;
};

std::string absent_dir(const std::string& name) {
  const std::string dir = test::temp_path(name);
  test::remove_all(dir);
  return dir;
}

TEST(CheckpointManager, KeepsTheNewestKAndSavesWhenDue) {
  const std::string dir = absent_dir("manager_keep");
  Trained t(1);
  CheckpointManager manager(CheckpointManagerOptions().dir(dir).save_every(2).keep_last(3),
                            *t.model, &t.optimizer, nullptr);
  std::vector<int64_t> saved;
  for (int64_t steps_done = 1; steps_done <= 11; ++steps_done) {
    if (manager.due(steps_done)) {
      manager.save(steps_done, "{}");
      saved.push_back(steps_done);
    }
  }
  EXPECT_EQ(saved, (std::vector<int64_t>{2, 4, 6, 8, 10}));
  EXPECT_EQ(manager.saved_steps(), (std::vector<int64_t>{6, 8, 10}));
  EXPECT_EQ(test::read_bytes(dir + "/latest"), "step_00000010\n");
  // 11 steps end off the save_every grid: the final state needs its own save; 10 do not.
  EXPECT_TRUE(manager.final_save_due(11, 0));
  EXPECT_FALSE(manager.final_save_due(10, 0));
  // A resumed run that ran no step still writes its final state.
  EXPECT_TRUE(manager.final_save_due(10, 10));
  // keep_last 0 keeps every checkpoint.
  CheckpointManager keep_all(CheckpointManagerOptions().dir(dir).keep_last(0), *t.model,
                             &t.optimizer, nullptr);
  EXPECT_FALSE(keep_all.due(4));  // no save_every: never due
  keep_all.save(12);
  keep_all.save(13);
  EXPECT_EQ(keep_all.saved_steps(), (std::vector<int64_t>{6, 8, 10, 12, 13}));
}

TEST(CheckpointManager, ResumeAutoLoadsTheNewestOrStartsFresh) {
  const std::string dir = absent_dir("manager_auto");
  const auto options = CheckpointManagerOptions().dir(dir).save_every(1);
  Trained fresh(0);
  CheckpointManager empty(options, *fresh.model, &fresh.optimizer, nullptr);
  EXPECT_EQ(empty.resume_path("auto"), "");
  EXPECT_FALSE(empty.load("auto").has_value());
  EXPECT_FALSE(empty.load("").has_value());

  Trained at2(2), at3(3);
  CheckpointManager(options, *at2.model, &at2.optimizer, nullptr).save(2, R"({"next_step": 2})");
  CheckpointManager(options, *at3.model, &at3.optimizer, nullptr).save(3, R"({"next_step": 3})");
  EXPECT_EQ(empty.resume_path("auto"), dir);
  EXPECT_EQ(empty.resume_path(dir + "/step_00000002"), dir + "/step_00000002");

  const auto loaded = empty.load("auto");
  ASSERT_TRUE(loaded.has_value());
  EXPECT_EQ(loaded->step, 3);
  EXPECT_EQ(loaded->user_json, R"({"next_step":3})");
  EXPECT_TRUE(at::equal(fresh.model->weight, at3.model->weight));
  EXPECT_TRUE(at::equal(fresh.model->bias, at3.model->bias));
  // The optimizer state came back too: one more step from it is the uninterrupted run's.
  Trained at4(4);
  const at::Tensor x = at::arange(8, at::kFloat).view({2, 4}) / 8;
  fresh.optimizer.zero_grad();
  fresh.model->forward(x).square().sum().backward();
  fresh.optimizer.step();
  EXPECT_TRUE(at::equal(fresh.model->weight, at4.model->weight));
}

TEST(CheckpointManager, BadOptionsAreRefusedNamingTheValue) {
  Trained t(0);
  std::string msg = test::error_message([&] {
    CheckpointManager(CheckpointManagerOptions().keep_last(-1), *t.model, &t.optimizer, nullptr);
  });
  EXPECT_NE(msg.find("keep_last must be >= 0, got -1"), std::string::npos) << msg;
  CheckpointManager no_dir(CheckpointManagerOptions(), *t.model, &t.optimizer, nullptr);
  EXPECT_FALSE(no_dir.due(1));
  EXPECT_FALSE(no_dir.final_save_due(1, 0));
  msg = test::error_message([&] { no_dir.save(1); });
  EXPECT_NE(msg.find("no dir"), std::string::npos) << msg;
}

}  // namespace
}  // namespace fsdp::train
