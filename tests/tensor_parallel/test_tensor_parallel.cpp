// Tensor parallelism against one process: the named mesh's groups, a column/row pair of linear
// layers (outputs and every gradient), a packed column split, and llama-tiny (also with Qwen3's
// q/k norms) and GPT-2 tiny trained under tensor parallelism alone (tp 2) and under FSDP over
// dp x tp (2 x 2), with and
// without activation checkpointing: losses and gradient norms within 1e-5 (relative) over 5
// AdamW steps with clipping, every parameter slice within 1e-5 of the reference's. Full and
// sharded checkpoints of a dp x tp model hold the global tensors. Bad plans and a collective that
// cannot complete end in errors naming the fault.
#include "support/checkpoint_util.h"
#include "support/harness.h"
#include "support/test_support.h"
#include "tensor_parallel/tp_training.h"

#include <fsdp/checkpoint/checkpoint.h>
#include <fsdp/checkpoint/safetensors.h>
#include <fsdp/fully_shard.h>
#include <fsdp/named_mesh.h>
#include <fsdp/tensor_parallel.h>
#include <models/common/modules.h>
#include <models/gpt2/gpt2.h>
#include <models/gpt2/gpt2_parallelize.h>
#include <models/llama/llama.h>
#include <models/llama/llama_parallelize.h>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::test {
namespace {

using models::LlamaConfig;
using models::LlamaForCausalLM;
using models::LlamaOptions;
using ::testing::HasSubstr;

TEST(NamedMesh, KeepsTheLastDimensionInnermost) {
  std::vector<std::vector<int>> coordinates(4);
  std::vector<double> tp_sums(4), dp_sums(4);
  run_ranks_in_threads(4, [&](std::shared_ptr<ProcessGroup> world) {
    const NamedMesh mesh(world, {{"dp", 2}, {"tp", 2}});
    const int r = world->rank();
    coordinates[r] = {mesh.coordinate("dp"), mesh.coordinate("tp")};
    EXPECT_EQ(mesh["tp"].name(), "tp");
    at::Tensor t = at::full({1}, static_cast<double>(r), at::kDouble);
    mesh.group("tp")->all_reduce(t, ReduceOp::kSum)->wait();
    tp_sums[r] = t.item<double>();
    t.fill_(static_cast<double>(r));
    mesh["dp"].shard_group().all_reduce(t, ReduceOp::kSum)->wait();
    dp_sums[r] = t.item<double>();
  });
  // tp groups {0, 1} and {2, 3}; dp groups {0, 2} and {1, 3}.
  EXPECT_EQ(coordinates, (std::vector<std::vector<int>>{{0, 0}, {0, 1}, {1, 0}, {1, 1}}));
  EXPECT_EQ(tp_sums, (std::vector<double>{1, 1, 5, 5}));
  EXPECT_EQ(dp_sums, (std::vector<double>{2, 4, 2, 4}));
}

TEST(NamedMesh, RefusesSizesThatDoNotMakeTheWorld) {
  try {
    run_ranks_in_threads(4, [](std::shared_ptr<ProcessGroup> world) {
      NamedMesh mesh(world, {{"dp", 3}, {"tp", 2}});
    });
    FAIL() << "a 3 x 2 mesh over 4 ranks was accepted";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("dp 3 x tp 2) hold 6 ranks, but the world has 4"));
  }
  run_ranks_in_threads(1, [](std::shared_ptr<ProcessGroup> world) {
    const NamedMesh mesh(world, {{"dp", 1}});
    EXPECT_THAT([&] { mesh["tp"]; }, ::testing::ThrowsMessage<c10::Error>(
                                         HasSubstr("no dimension named 'tp' in the mesh (dp 1)")));
  });
}

// A column layer then a row layer, as attention's projections and the MLP use them.
struct Pair : torch::nn::Module {
  Pair() {
    up = register_module("up", torch::nn::Linear(torch::nn::LinearOptions(6, 8).bias(true)));
    down = register_module("down", torch::nn::Linear(torch::nn::LinearOptions(8, 6).bias(true)));
    auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
    at::NoGradGuard no_grad;
    for (auto& p : parameters()) p.uniform_(-0.5, 0.5, gen);
  }
  at::Tensor forward(const at::Tensor& x) {
    return fsdp::linear(down, at::gelu(fsdp::linear(up, x)));
  }
  torch::nn::Linear up{nullptr}, down{nullptr};
};

TEST(TensorParallel, ColumnThenRowMatchesOneProcess) {
  const at::Tensor x = seeded_uniform({3, 5, 6}, 11, 1.0);
  Pair reference;
  const at::Tensor xr = x.clone().requires_grad_(true);
  const at::Tensor yr = reference.forward(xr);
  (yr * yr).sum().backward();
  run_ranks_in_threads(2, [&](std::shared_ptr<ProcessGroup> group) {
    const int r = group->rank();
    Pair model;
    parallelize_module(model, DeviceMesh(group, "tp"),
                       {{"up", ColwiseParallel()}, {"down", RowwiseParallel()}});
    ASSERT_EQ(model.up->weight.sizes(), (std::vector<int64_t>{4, 6}));
    ASSERT_EQ(model.down->weight.sizes(), (std::vector<int64_t>{6, 4}));
    const at::Tensor xt = x.clone().requires_grad_(true);
    const at::Tensor y = model.forward(xt);
    (y * y).sum().backward();
    EXPECT_TRUE(at::allclose(y, yr, 0, 1e-6));
    EXPECT_TRUE(at::allclose(xt.grad(), xr.grad(), 0, 1e-6));
    const auto &ref_up = reference.up, &ref_down = reference.down;
    EXPECT_TRUE(
        at::allclose(model.up->weight.grad(), ref_up->weight.grad().narrow(0, 4 * r, 4), 0, 1e-6));
    EXPECT_TRUE(
        at::allclose(model.up->bias.grad(), ref_up->bias.grad().narrow(0, 4 * r, 4), 0, 1e-6));
    EXPECT_TRUE(at::allclose(model.down->weight.grad(), ref_down->weight.grad().narrow(1, 4 * r, 4),
                             0, 1e-6));
    EXPECT_TRUE(at::allclose(model.down->bias.grad(), ref_down->bias.grad(), 0, 1e-6));
    const TensorParallelPlacement* placement = tensor_parallel_placement(model.down->weight);
    ASSERT_NE(placement, nullptr);
    EXPECT_EQ(placement->dim, 1);
    EXPECT_EQ(placement->global_shape, (std::vector<int64_t>{6, 8}));
    EXPECT_EQ(tensor_parallel_placement(model.down->bias), nullptr);  // replicated
  });
}

// --- llama-tiny, Qwen3 and GPT-2 tiny under dp x tp against one process (tp_training.h) ---

TEST(TensorParallelLlama, Tp2MatchesSingleProcess) {
  expect_matches_reference({Family::kLlama, 1, 2, /*activation_checkpoint=*/false});
}

TEST(TensorParallelLlama, Dp2Tp2MatchesSingleProcess) {
  expect_matches_reference({Family::kLlama, 2, 2, /*activation_checkpoint=*/false});
}

TEST(TensorParallelLlama, Dp2Tp2WithActivationCheckpointingMatchesSingleProcess) {
  expect_matches_reference({Family::kLlama, 2, 2, /*activation_checkpoint=*/true});
}

// The q/k norms' weights are whole on every rank: without the sum of their gradients over tp they
// drift apart from the reference's (and from each other) at the first step.
TEST(TensorParallelQwen3, Dp2Tp2MatchesSingleProcess) {
  expect_matches_reference({Family::kQwen3, 2, 2, /*activation_checkpoint=*/false});
}

TEST(TensorParallelGpt2, Tp2MatchesSingleProcess) {
  expect_matches_reference({Family::kGpt2, 1, 2, /*activation_checkpoint=*/false});
}

TEST(TensorParallelGpt2, Dp2Tp2WithActivationCheckpointingMatchesSingleProcess) {
  expect_matches_reference({Family::kGpt2, 2, 2, /*activation_checkpoint=*/true});
}

// A packed column split keeps each block's rows together: rank r gets rows r*2.. of each third.
TEST(TensorParallel, PackedColumnSplitTakesEachBlocksPart) {
  run_ranks_in_threads(2, [](std::shared_ptr<ProcessGroup> group) {
    // A module holding the fused layer as "qkv", as an attention module holds c_attn.
    struct Holder : torch::nn::Module {
      Holder() { qkv = register_module("qkv", torch::nn::Linear(torch::nn::LinearOptions(1, 12))); }
      torch::nn::Linear qkv{nullptr};
    } holder;
    torch::nn::Linear& fused = holder.qkv;
    {
      at::NoGradGuard no_grad;
      fused->weight.copy_(at::arange(12, at::kFloat).reshape({12, 1}));
      fused->bias.copy_(at::arange(12, at::kFloat));
    }
    parallelize_module(holder, DeviceMesh(group, "tp"), {{"qkv", ColwiseParallel(3)}});
    const at::Tensor want = group->rank() == 0 ? at::tensor({0.f, 1.f, 4.f, 5.f, 8.f, 9.f})
                                               : at::tensor({2.f, 3.f, 6.f, 7.f, 10.f, 11.f});
    EXPECT_TRUE(at::equal(fused->weight.reshape({-1}), want));
    EXPECT_TRUE(at::equal(fused->bias, want));
    EXPECT_EQ(tensor_parallel_placement(fused->weight)->packed, 3);
  });
}

// --- errors ---

TEST(TensorParallelErrors, KeyValueHeadsMustDivide) {
  LlamaConfig config = LlamaConfig::tiny();  // 4 query heads, 2 key/value heads
  EXPECT_THAT([&] { models::llama_layer_tp_plan(config, 4); },
              ::testing::ThrowsMessage<c10::Error>(
                  HasSubstr("needs num_key_value_heads divisible by it, got 2")));
}

TEST(TensorParallelErrors, PlanEntriesMustMatchLinearLayersThatSplitEvenly) {
  run_ranks_in_threads(1, [](std::shared_ptr<ProcessGroup> group) {
    const DeviceMesh tp(group, "tp");
    Pair a;
    EXPECT_THAT(
        [&] {
          parallelize_module(a, tp, {{"mlp.up", ColwiseParallel()}});
        },
        ::testing::ThrowsMessage<c10::Error>(
            HasSubstr("plan entry 'mlp.up' (ColwiseParallel) matches no module")));
  });
  run_ranks_in_threads(4, [](std::shared_ptr<ProcessGroup> group) {
    Pair b;  // down has 6 output features: rowwise splits the 8 inputs, colwise the 6 outputs
    EXPECT_THAT(
        [&] {
          parallelize_module(b, DeviceMesh(group, "tp"), {{"down", ColwiseParallel()}});
        },
        ::testing::ThrowsMessage<c10::Error>(
            HasSubstr("splits layer 'down' along its output features, 6, which do not divide by "
                      "the tensor-parallel size 4")));
  });
}

TEST(TensorParallelErrors, ACollectiveThatCannotCompleteNamesTheLayerAndTheDimension) {
  const std::string message = error_when_rank_1_is_gone([](const auto& group) {
    Pair model;
    parallelize_module(model, DeviceMesh(group, "tp"),
                       {{"up", ColwiseParallel()}, {"down", RowwiseParallel()}});
    model.forward(at::ones({1, 2, 6}));
  });
  EXPECT_THAT(message, HasSubstr("tensor-parallel all-reduce of the partial outputs of layer "
                                 "'down' over mesh dimension 'tp' on rank 0 of 2 failed"));
  EXPECT_THAT(message, HasSubstr("timed out"));
}

// Checkpoints hold global tensors ([Note: tensor-parallel slices in checkpoints]): the pair
// split as a packed column layer (each rank keeps its part of each of 2 blocks) and a row layer
// (columns), sharded by FSDP over dp on top (dp 2 x tp 2), exports exactly the unsplit pair, and
// its sharded checkpoint loads exactly into one unsplit process and into tp 2 alone.
TEST(TensorParallelCheckpoint, FullAndShardedCheckpointsHoldTheGlobalTensors) {
  const Pair reference;
  const TensorParallelPlan plan = {{"up", ColwiseParallel(2)}, {"down", RowwiseParallel()}};
  const std::string dir = temp_dir("tp_checkpoint");
  run_ranks_in_threads(4, [&](std::shared_ptr<ProcessGroup> world) {
    const NamedMesh mesh(world, {{"dp", 2}, {"tp", 2}});
    auto model = std::make_shared<Pair>();
    parallelize_module(*model, mesh["tp"], plan);
    fully_shard(model, mesh["dp"]);
    checkpoint::save_full(dir + "/pair.safetensors", *model, world.get());
    checkpoint::save_sharded(dir + "/sharded", *model, nullptr, world.get());
  });
  const checkpoint::SafetensorsReader exported(dir + "/pair.safetensors");
  for (const auto& item : reference.named_parameters()) {
    EXPECT_TRUE(at::equal(exported.read(item.key()), item.value())) << item.key();
  }
  const auto zeroed = [] {
    auto pair = std::make_unique<Pair>();
    at::NoGradGuard no_grad;
    for (auto& p : pair->parameters()) p.zero_();
    return pair;
  };
  auto one = zeroed();
  checkpoint::load_sharded(dir + "/sharded", *one, nullptr, nullptr);
  for (const auto& item : reference.named_parameters()) {
    EXPECT_TRUE(at::equal(one->named_parameters()[item.key()], item.value())) << item.key();
  }
  run_ranks_in_threads(2, [&](std::shared_ptr<ProcessGroup> group) {
    auto model = zeroed();
    const TensorParallelPlacement placement{group, 0, 2, {8, 6}};
    parallelize_module(*model, DeviceMesh(group, "tp"), plan);
    checkpoint::load_sharded(dir + "/sharded", *model, nullptr, group.get());
    const int r = group->rank();
    EXPECT_TRUE(
        at::equal(model->up->weight,
                  tensor_parallel_slice_view(reference.up->weight, placement, r).reshape({4, 6})));
    EXPECT_TRUE(at::equal(model->down->weight, reference.down->weight.narrow(1, 4 * r, 4)));
    EXPECT_TRUE(at::equal(model->down->bias, reference.down->bias));
  });
}

}  // namespace
}  // namespace fsdp::test
