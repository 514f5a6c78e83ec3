// ShardedGradScaler against PyTorch's torch.amp.GradScaler
// (tests/runtime/grad_scaler_reference.py): the same scripted steps (an fp16 loss whose gradient
// overflows by itself at a large scale, and inf / nan forced into it) must give the same scale,
// growth tracker, skipped steps and parameters, bit for bit, in one process and on every rank of a
// 1-D and a 2-D (HSDP) mesh where only one rank's gradient overflows.
#include "support/test_support.h"

#include <fsdp/comm/rendezvous.h>
#include <fsdp/grad_scaler.h>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/optim/sgd.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#ifndef FSDP_SOURCE_DIR
#error "tests/CMakeLists.txt defines FSDP_SOURCE_DIR"
#endif

namespace fsdp {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kGrowthInterval = 3;  // small, so that the scale grows within the script
constexpr double kLr = 0.25;

// Coefficients of each step's loss sum(p * c) (computed in fp16): the large ones overflow fp16
// gradients at scales >= 32768, the small ones never; "inf" and "nan" force an overflow.
const std::vector<std::vector<std::string>> kSteps = {
    {"0.75", "-1.5", "0.3", "2.0"}, {"0.75", "-1.5", "0.3", "2.0"}, {"0.1", "0.2", "-0.3", "0.05"},
    {"0.1", "0.2", "-0.3", "0.05"}, {"0.1", "0.2", "-0.3", "0.05"}, {"0.1", "0.2", "-0.3", "0.05"},
    {"0.1", "inf", "-0.3", "0.05"}, {"0.1", "0.2", "nan", "0.05"},  {"0.1", "0.2", "-0.3", "0.05"},
    {"0.1", "0.2", "-0.3", "0.05"}, {"0.1", "0.2", "-0.3", "0.05"}, {"1.5", "0.2", "-0.3", "0.05"},
    {"0.1", "0.2", "-0.3", "0.05"}, {"0.1", "0.2", "-0.3", "0.05"}, {"-0.2", "0.7", "0.3", "0.05"}};
const std::vector<float> kParam = {0.5f, -1.25f, 2.0f, 0.125f};

// PyTorch's record of every step (see the script's docstring), computed once.
const std::vector<nlohmann::json>& reference() {
  static const std::vector<nlohmann::json> lines = [] {
    const nlohmann::json spec = {{"init_scale", 65536.0},
                                 {"growth_factor", 2.0},
                                 {"backoff_factor", 0.5},
                                 {"growth_interval", kGrowthInterval},
                                 {"lr", kLr},
                                 {"param", kParam},
                                 {"steps", kSteps}};
    const std::string path = test::temp_path("grad_scaler_spec.json");
    std::ofstream(path) << spec.dump();
    const test::ReferenceResult r = test::run_reference(
        test::reference_python(),
        {FSDP_SOURCE_DIR "/tests/runtime/grad_scaler_reference.py", path, {path}, {}});
    EXPECT_EQ(r.exit_code, 0) << r.output;
    std::vector<nlohmann::json> parsed;
    std::istringstream in(r.output);
    for (std::string line; std::getline(in, line);) parsed.push_back(nlohmann::json::parse(line));
    return parsed;
  }();
  return lines;
}

at::Tensor coefficients(const std::vector<std::string>& text, double factor = 1.0) {
  std::vector<float> values;
  for (const auto& s : text) {
    const double v = std::stod(s);
    // Scaled down (a rank that must not overflow by itself): finite and small.
    values.push_back(static_cast<float>(factor == 1.0      ? v
                                        : std::isfinite(v) ? v * factor
                                                           : factor));
  }
  return at::tensor(values);
}

// Drives scaler through kSteps and checks every step against PyTorch. overflowing(step) says
// whether this rank gets the step's own coefficients when PyTorch skipped it; the other ranks
// then get finite, small ones (no overflow of their own), so they skip only if the found-inf
// flag reached them.
void expect_same_as_torch(ShardedGradScaler& scaler, const std::function<bool(size_t)>& overflowing,
                          const std::string& who) {
  const auto& want = reference();
  ASSERT_EQ(want.size(), kSteps.size());
  at::Tensor p = at::tensor(kParam).set_requires_grad(true);
  torch::optim::SGD optimizer({p}, torch::optim::SGDOptions(kLr));
  int skipped = 0;
  for (size_t i = 0; i < kSteps.size(); ++i) {
    const bool torch_stepped = want[i]["stepped"];
    const at::Tensor c = coefficients(kSteps[i], torch_stepped || overflowing(i) ? 1.0 : 1e-3);
    optimizer.zero_grad();
    EXPECT_EQ(scaler.get_scale(), want[i]["scale"].get<double>()) << who << " step " << i;
    scaler.scale((p.to(at::kHalf) * c.to(at::kHalf)).sum()).backward();
    const bool found_inf = scaler.unscale_(optimizer);
    EXPECT_EQ(scaler.step(optimizer), torch_stepped) << who << " step " << i;
    EXPECT_EQ(found_inf, !torch_stepped) << who << " step " << i;
    scaler.update();
    skipped += torch_stepped ? 0 : 1;
    EXPECT_EQ(scaler.get_scale(), want[i]["scale_after"].get<double>()) << who << " step " << i;
    EXPECT_EQ(scaler.growth_tracker(), want[i]["growth_tracker"].get<int64_t>())
        << who << " step " << i;
    const auto want_p = want[i]["param"].get<std::vector<float>>();
    for (size_t k = 0; k < want_p.size(); ++k) {
      EXPECT_EQ(p[static_cast<int64_t>(k)].item<float>(), want_p[k])
          << who << " step " << i << " element " << k;
    }
  }
  // The script has both skips and growth, or it tests less than it claims.
  EXPECT_GE(skipped, 4);
  EXPECT_LT(skipped, static_cast<int>(kSteps.size()) - 4);
}

GradScalerOptions small_interval() { return GradScalerOptions().growth_interval(kGrowthInterval); }

TEST(GradScaler, MatchesTorchAmpGradScalerInOneProcess) {
  ShardedGradScaler scaler(std::nullopt, small_interval());
  expect_same_as_torch(
      scaler, [](size_t) { return true; }, "one process");
}

TEST(GradScaler, AnOverflowOnOneRankSkipsTheStepOnEveryRank) {
  constexpr int kWorld = 3;
  run_ranks_in_threads(
      kWorld,
      [](std::shared_ptr<ProcessGroup> group) {
        const int rank = group->rank();
        ShardedGradScaler scaler(DeviceMesh(group), small_interval());
        // Each overflowing step overflows on one rank only, a different one each time.
        expect_same_as_torch(
            scaler, [rank](size_t step) { return static_cast<int>(step % kWorld) == rank; },
            "rank " + std::to_string(rank));
      },
      test::test_options());
}

TEST(GradScaler, HsdpAgreesAcrossReplicas) {
  // 2 replicas x 2 shards: an overflow on rank 3 alone must reach ranks 0 and 1, which share
  // no shard group with it.
  run_ranks_in_threads(
      4,
      [](std::shared_ptr<ProcessGroup> group) {
        const int rank = group->rank();
        ShardedGradScaler scaler(DeviceMesh::hybrid(group, 2), small_interval());
        expect_same_as_torch(
            scaler, [rank](size_t) { return rank == 3; }, "rank " + std::to_string(rank));
      },
      test::test_options());
}

TEST(GradScaler, StateRoundTrips) {
  ShardedGradScaler a(std::nullopt, small_interval());
  at::Tensor p = at::ones({2}).set_requires_grad(true);
  torch::optim::SGD optimizer({p}, torch::optim::SGDOptions(0.1));
  for (const float c :
       {std::numeric_limits<float>::infinity(), 1.0f}) {  // one overflow, then one good step
    optimizer.zero_grad();
    a.scale((p * c).sum()).backward();
    a.step(optimizer);
    a.update();
  }
  const GradScalerState s = a.state();
  EXPECT_EQ(s.scale, 32768.0);
  EXPECT_EQ(s.growth_tracker, 1);
  ShardedGradScaler b(std::nullopt);  // other hyper-parameters: load_state replaces them
  b.load_state(s);
  EXPECT_EQ(b.get_scale(), 32768.0);
  EXPECT_EQ(b.growth_tracker(), 1);
  EXPECT_EQ(b.state().growth_interval, kGrowthInterval);
}

TEST(GradScaler, MisuseAndBadValuesAreRefusedNamingThem) {
  EXPECT_THAT(test::error_message(
                  [] { ShardedGradScaler(std::nullopt, GradScalerOptions().growth_factor(1.0)); }),
              HasSubstr("growth_factor must be a finite number > 1, got 1"));
  EXPECT_THAT(test::error_message(
                  [] { ShardedGradScaler(std::nullopt, GradScalerOptions().backoff_factor(1.5)); }),
              HasSubstr("backoff_factor must be in (0, 1), got 1.5"));
  EXPECT_THAT(test::error_message(
                  [] { ShardedGradScaler(std::nullopt, GradScalerOptions().growth_interval(0)); }),
              HasSubstr("growth_interval must be in [1, 2^31), got 0"));
  EXPECT_THAT(test::error_message(
                  [] { ShardedGradScaler(std::nullopt, GradScalerOptions().init_scale(-2)); }),
              HasSubstr("init_scale: the scale must be a positive, finite float32 value, got -2"));

  ShardedGradScaler scaler(std::nullopt);
  at::Tensor p = at::ones({2}).set_requires_grad(true);
  torch::optim::SGD optimizer({p}, torch::optim::SGDOptions(0.1));
  EXPECT_THAT(test::error_message([&] { scaler.update(); }),
              HasSubstr("no gradients were unscaled in this step"));
  scaler.scale(p.sum()).backward();
  scaler.unscale_(optimizer);
  EXPECT_THAT(test::error_message([&] { scaler.unscale_(optimizer); }),
              HasSubstr("unscale_ was already called since the last update()"));
  scaler.step(optimizer);
  EXPECT_THAT(test::error_message([&] { scaler.step(optimizer); }),
              HasSubstr("step was already called since the last update()"));
  scaler.update();
  GradScalerState bad;
  bad.growth_tracker = 2000;
  EXPECT_THAT(test::error_message([&] { scaler.load_state(bad); }),
              HasSubstr("growth_tracker must be in [0, growth_interval 2000), got 2000"));
  bad = GradScalerState();
  bad.scale = std::numeric_limits<double>::infinity();
  EXPECT_THAT(test::error_message([&] { scaler.load_state(bad); }),
              HasSubstr("the scale must be a positive, finite float32 value, got inf"));
}

}  // namespace
}  // namespace fsdp
