// The learning-rate schedules (fsdp/train/lr_schedule.h): every step's rate against PyTorch's
// own schedulers (torch.optim.lr_scheduler chained as lr_schedule_reference.py says, cached:
// support/reference_cache.h), and apply_lr setting the rate on every parameter group.
#include <fsdp/train/lr_schedule.h>

#include "support/files.h"
#include "support/test_support.h"

#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace fsdp::train {
namespace {

// The schedules compared, each over its whole run: warm-up or none, every kind, a floor of 0
// and above it. (wsd's decay_frac * total_steps is whole: Python rounds halves to even, C++
// away from zero.)
std::vector<LrSchedule> cases() {
  using K = LrScheduleKind;
  return {{K::kConstant, 3e-3, 0, 0, 0.2, 10},  {K::kConstant, 3e-3, 0, 4, 0.2, 12},
          {K::kCosine, 1e-3, 1e-5, 0, 0.2, 20}, {K::kCosine, 3e-3, 3e-4, 3, 0.2, 25},
          {K::kWsd, 2e-3, 0, 3, 0.25, 20},      {K::kWsd, 1e-3, 1e-4, 0, 0.5, 16}};
}

nlohmann::json case_json(const LrSchedule& s) {
  const char* kinds[] = {"constant", "cosine", "wsd"};
  return {{"kind", kinds[static_cast<int>(s.kind)]},
          {"peak_lr", s.peak_lr},
          {"min_lr", s.min_lr},
          {"warmup_steps", s.warmup_steps},
          {"decay_frac", s.decay_frac},
          {"total_steps", s.total_steps}};
}

// [Note: schedule tolerance] PyTorch's schedulers update the rate step by step (a product of
// factors, cosine's recursive form), ours is a closed form of the step: the two differ by float
// rounding, a few ulps a step, far below 1e-12 of the peak over these runs.
TEST(LrScheduleParity, EveryStepMatchesTorchSchedulers) {
  const std::string dir = test::temp_path("lr_schedule");
  test::remove_all(dir);
  ASSERT_TRUE(test::make_directories(dir));
  nlohmann::json list = nlohmann::json::array();
  for (const auto& s : cases()) list.push_back(case_json(s));
  const std::string cases_path = dir + "/cases.json", out = dir + "/rates.json";
  ASSERT_TRUE(test::write_bytes(cases_path, list.dump()));
  test::ReferenceRun run;
  run.script = FSDP_SOURCE_DIR "/tests/train/lr_schedule_reference.py";
  run.args = "--cases " + cases_path + " --out " + out;
  run.inputs = {cases_path};
  run.outputs = {out};
  const test::ReferenceResult r = test::run_reference(test::reference_python(), run);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto want = nlohmann::json::parse(test::read_bytes(out));
  ASSERT_EQ(want.size(), cases().size());
  for (size_t c = 0; c < cases().size(); ++c) {
    const LrSchedule s = cases()[c];
    ASSERT_EQ(static_cast<int64_t>(want[c].size()), s.total_steps);
    for (int64_t step = 0; step < s.total_steps; ++step) {
      EXPECT_NEAR(lr_at(s, step), want[c][step].get<double>(), 1e-12 * s.peak_lr)
          << case_json(s).dump() << " step " << step;
    }
  }
}

TEST(LrSchedule, WsdEndsAtTheFloorAndCosineStartsAtThePeak) {
  const LrSchedule wsd{LrScheduleKind::kWsd, 2e-3, 1e-4, 0, 0.25, 20};
  EXPECT_DOUBLE_EQ(lr_at(wsd, 19), 1e-4);
  EXPECT_DOUBLE_EQ(lr_at(wsd, 14), 2e-3);
  const LrSchedule cosine{LrScheduleKind::kCosine, 1e-3, 0, 2, 0.2, 10};
  EXPECT_DOUBLE_EQ(lr_at(cosine, 0), 0.5e-3);
  EXPECT_DOUBLE_EQ(lr_at(cosine, 2), 1e-3);
  EXPECT_NE(test::error_message([&] { lr_at(cosine, -1); }).find("-1"), std::string::npos);
}

TEST(LrSchedule, ApplyLrSetsEveryParameterGroup) {
  torch::nn::Linear a(2, 2), b(2, 2);
  torch::optim::AdamW optimizer(a->parameters(), torch::optim::AdamWOptions(1.0));
  optimizer.add_param_group(torch::optim::OptimizerParamGroup(
      b->parameters(), std::make_unique<torch::optim::AdamWOptions>(2.0)));
  const LrSchedule s{LrScheduleKind::kCosine, 1e-3, 1e-5, 0, 0.2, 20};
  const double lr = apply_lr(optimizer, s, 7);
  EXPECT_DOUBLE_EQ(lr, lr_at(s, 7));
  for (auto& group : optimizer.param_groups()) {
    EXPECT_DOUBLE_EQ(static_cast<torch::optim::AdamWOptions&>(group.options()).lr(), lr);
  }
}

}  // namespace
}  // namespace fsdp::train
