// fsdp-train with the models of the registry other than GPT-2, as real processes: --model
// llama-tiny on 2 ranks reproduces the --no-fsdp reference step by step within 1e-5;
// llama-debug on 1 rank bit for bit and on 2 within 2e-4 (at 6M parameters the fp32 rounding
// of gradient sums split over 2 ranks shows in the gradient norm at a few 1e-6 from the first
// step, growing to ~6e-5 through AdamW by step 3, as GPT-2 `small` does); an unknown --model
// lists the registered names.
#include "support/test_support.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <string>

namespace fsdp::train {
namespace {

using test::CommandResult;
using test::fsdp_train_binary;
using test::read_json_lines;
using test::run_command;
using ::testing::HasSubstr;

struct ModelCase {
  std::string model;
  int world;
  double tolerance;  // relative, on every step's loss and gradient norm
};

class FsdpTrainModel : public ::testing::TestWithParam<ModelCase> {};

TEST_P(FsdpTrainModel, MatchesTheSingleProcessReference) {
  const ModelCase c = GetParam();
  const std::string common =
      "--model " + c.model + " --steps 3 --global-batch 4 --seq-len 16 --quiet --seed 5";
  const std::string base = test::temp_path("fsdp_train_" + c.model + "_" + std::to_string(c.world));
  const CommandResult a = run_command(fsdp_train_binary() + " --nproc " + std::to_string(c.world) +
                                      " " + common + " --metrics " + base + ".jsonl");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const CommandResult b = run_command(fsdp_train_binary() + " --no-fsdp " + common + " --metrics " +
                                      base + "_ref.jsonl");
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const auto got = read_json_lines(base + ".jsonl");
  const auto want = read_json_lines(base + "_ref.jsonl");
  ASSERT_EQ(got.size(), 3u);
  ASSERT_EQ(want.size(), 3u);
  double worst = 0;
  for (size_t s = 0; s < got.size(); ++s) {
    const double loss = got[s]["loss"], ref_loss = want[s]["loss"];
    const double norm = got[s]["grad_norm"], ref_norm = want[s]["grad_norm"];
    EXPECT_NEAR(loss, ref_loss, c.tolerance * ref_loss) << "step " << s + 1;
    EXPECT_NEAR(norm, ref_norm, c.tolerance * ref_norm) << "step " << s + 1;
    worst = std::max(
        {worst, std::abs(loss - ref_loss) / ref_loss, std::abs(norm - ref_norm) / ref_norm});
    // Each rank holds about 1/W of the parameters.
    const int64_t full = want[s]["ranks"][0]["param_bytes"];
    for (int r = 0; r < c.world; ++r) {
      const int64_t mine = got[s]["ranks"][r]["param_bytes"];
      EXPECT_GE(mine, full / c.world);
      EXPECT_LT(mine, full / c.world + full / 50);
    }
  }
  std::cout << c.model << " W=" << c.world << ": max relative difference " << worst << "\n";
  EXPECT_LT(want.back()["loss"].get<double>(), want.front()["loss"].get<double>());
}

INSTANTIATE_TEST_SUITE_P(Llama, FsdpTrainModel,
                         ::testing::Values(ModelCase{"llama-tiny", 2, 1e-5},
                                           ModelCase{"llama-debug", 1, 0.0},
                                           ModelCase{"llama-debug", 2, 2e-4}),
                         [](const auto& info) {
                           std::string name =
                               info.param.model + "_w" + std::to_string(info.param.world);
                           for (char& ch : name)
                             if (ch == '-') ch = '_';
                           return name;
                         });

TEST(FsdpTrainModels, UnknownModelListsTheRegisteredNames) {
  const CommandResult r = run_command(fsdp_train_binary() + " --model llama-70b --steps 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("--model: llama-70b not in {"));
  EXPECT_THAT(r.output, HasSubstr("gpt2-xl"));
  EXPECT_THAT(r.output, HasSubstr("llama-8b"));
}

}  // namespace
}  // namespace fsdp::train
