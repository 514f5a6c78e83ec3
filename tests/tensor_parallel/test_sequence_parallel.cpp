// Sequence parallelism against one process: a norm and a gathered block of column layers with a
// row layer reduce-scattering into sequence shards (outputs, every gradient, and how many
// collectives each way: one gather and one reduce-scatter for the block's input, not one
// all-reduce per column layer); llama-tiny (also with Qwen3's q/k norms) and GPT-2 tiny trained
// under tp 2 and dp 2 x tp 2 with sequence parallelism, with and without activation
// checkpointing, within 1e-5 of one process (tp_training.h). A sequence that does not divide, an
// output gather whose gradient layout is unknown and a gather that cannot complete end in errors
// naming the fault.
#include "support/test_support.h"
#include "tensor_parallel/tp_training.h"

#include <fsdp/tensor_parallel.h>
#include <models/common/modules.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/normalization.h>

#include <string>
#include <vector>

namespace fsdp::test {
namespace {

using ::testing::HasSubstr;

// Two column layers reading one input and a row layer after them, as attention's q/k/v and o
// or the MLP's gate/up and down. Under PrepareModuleInput it gathers its input once.
struct Block : torch::nn::Module {
  Block() {
    a = register_module("a", torch::nn::Linear(torch::nn::LinearOptions(6, 8)));
    b = register_module("b", torch::nn::Linear(torch::nn::LinearOptions(6, 8)));
    out = register_module("out", torch::nn::Linear(torch::nn::LinearOptions(8, 6)));
  }
  at::Tensor forward(const at::Tensor& input) {
    const at::Tensor x = tensor_parallel_input(*this, input);
    return linear(out, at::gelu(linear(a, x)) * linear(b, x));
  }
  torch::nn::Linear a{nullptr}, b{nullptr}, out{nullptr};
};

// x + block(norm(x)): a transformer layer's half, its residual stream in sequence shards.
struct Layer : torch::nn::Module {
  Layer() {
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({6})));
    block = register_module("block", std::make_shared<Block>());
    auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
    at::NoGradGuard no_grad;
    for (auto& p : parameters()) p.uniform_(-0.5, 0.5, gen);
  }
  at::Tensor forward(const at::Tensor& x) {
    return x + block->forward(models::layer_norm(norm, x));
  }
  torch::nn::LayerNorm norm{nullptr};
  std::shared_ptr<Block> block;
};

const TensorParallelPlan kLayerPlan = {
    {"norm", SequenceParallel()},
    {"block", PrepareModuleInput(Layout::kSequenceShard, Layout::kReplicate)},
    {"block.a", ColwiseParallel()},
    {"block.b", ColwiseParallel()},
    {"block.out", RowwiseParallel(Layout::kSequenceShard)}};

void expect_near(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  EXPECT_TRUE(at::allclose(got, want, 0, 1e-6))
      << what << ": max difference " << (got - want).abs().max().item<double>();
}

TEST(SequenceParallel, NormAndGatheredBlockMatchOneProcess) {
  const at::Tensor x = seeded_uniform({3, 4, 6}, 11, 1.0);  // [batch, seq 4, features]
  Layer reference;
  const at::Tensor xr = x.clone().requires_grad_(true);
  const at::Tensor yr = reference.forward(xr);
  (yr * yr).sum().backward();
  run_ranks_in_threads(2, [&](std::shared_ptr<ProcessGroup> group) {
    const int r = group->rank();
    Layer layer;
    parallelize_module(layer, DeviceMesh(group, "tp"), kLayerPlan);
    const at::Tensor xs = x.narrow(1, 2 * r, 2).clone().requires_grad_(true);  // this shard
    group->reset_counters();
    const at::Tensor y = layer.forward(xs);
    const CommCounters forward = group->counters();
    (y * y).sum().backward();  // the ranks' sums add up to the reference's loss
    const CommCounters both = group->counters();
    expect_near(y, yr.narrow(1, 2 * r, 2), "output shard");
    expect_near(xs.grad(), xr.grad().narrow(1, 2 * r, 2), "input gradient shard");
    expect_near(layer.norm->weight.grad(), reference.norm->weight.grad(), "norm weight gradient");
    expect_near(layer.norm->bias.grad(), reference.norm->bias.grad(), "norm bias gradient");
    const Block &mine = *layer.block, &whole = *reference.block;
    expect_near(mine.a->weight.grad(), whole.a->weight.grad().narrow(0, 4 * r, 4), "a's weight");
    expect_near(mine.b->bias.grad(), whole.b->bias.grad().narrow(0, 4 * r, 4), "b's bias");
    expect_near(mine.out->weight.grad(), whole.out->weight.grad().narrow(1, 4 * r, 4),
                "out's weight");
    expect_near(mine.out->bias.grad(), whole.out->bias.grad(), "out's bias");
    // Forward: the block's input gathered, its output reduce-scattered, nothing else. Backward:
    // the output gradient gathered, the input gradient reduce-scattered once for a and b
    // ([Note: one gradient sum for a gathered input]); the norm's weight and bias and out's bias
    // (whole, each applied to this rank's positions) all-reduced.
    EXPECT_EQ(forward.all_gather.calls, 1);
    EXPECT_EQ(forward.reduce_scatter.calls, 1);
    EXPECT_EQ(forward.all_reduce.calls, 0);
    EXPECT_EQ(both.all_gather.calls - forward.all_gather.calls, 1);
    EXPECT_EQ(both.reduce_scatter.calls - forward.reduce_scatter.calls, 1);
    EXPECT_EQ(both.all_reduce.calls, 3);
  });
}

// --- models, against one process ---

TEST(SequenceParallelLlama, Tp2MatchesSingleProcess) {
  expect_matches_reference({Family::kLlama, 1, 2, /*activation_checkpoint=*/false,
                            /*sequence_parallel=*/true});
}

TEST(SequenceParallelLlama, Dp2Tp2WithActivationCheckpointingMatchesSingleProcess) {
  expect_matches_reference({Family::kLlama, 2, 2, /*activation_checkpoint=*/true,
                            /*sequence_parallel=*/true});
}

TEST(SequenceParallelQwen3, Dp2Tp2MatchesSingleProcess) {
  expect_matches_reference({Family::kQwen3, 2, 2, /*activation_checkpoint=*/false,
                            /*sequence_parallel=*/true});
}

TEST(SequenceParallelGpt2, Dp2Tp2MatchesSingleProcess) {
  expect_matches_reference({Family::kGpt2, 2, 2, /*activation_checkpoint=*/false,
                            /*sequence_parallel=*/true});
}

// --- errors ---

TEST(SequenceParallelErrors, ASequenceThatDoesNotDivideIsNamed) {
  run_ranks_in_threads(2, [](std::shared_ptr<ProcessGroup> group) {
    Layer layer;
    parallelize_module(layer, DeviceMesh(group, "tp"), kLayerPlan);
    // A row layer's output of 3 positions cannot be reduce-scattered into 2 shards.
    Block& block = *layer.block;
    EXPECT_THAT(
        [&] {
          linear(block.out, at::ones({1, 3, 4}));
        },
        ::testing::ThrowsMessage<c10::Error>(
            HasSubstr("sequence parallelism at layer 'block.out' over mesh dimension 'tp' splits "
                      "an activation of shape [1, 3, 6] along its sequence (dimension 1), which "
                      "must divide by the group's size 2")));
  });
}

TEST(SequenceParallelErrors, AnOutputGatherIsRefusedForItsUnknownGradient) {
  run_ranks_in_threads(1, [](std::shared_ptr<ProcessGroup> group) {
    Layer layer;
    EXPECT_THAT(
        [&] {
          parallelize_module(
              layer, DeviceMesh(group, "tp"),
              {{"norm", PrepareModuleOutput(Layout::kSequenceShard, Layout::kReplicate)}});
        },
        ::testing::ThrowsMessage<c10::Error>(
            HasSubstr("PrepareModuleOutput on 'norm' gathers its output from sequence shards")));
  });
}

TEST(SequenceParallelErrors, AGatherThatCannotCompleteNamesTheLayerAndTheDimension) {
  const std::string message = error_when_rank_1_is_gone([](const auto& group) {
    Layer layer;
    parallelize_module(layer, DeviceMesh(group, "tp"), kLayerPlan);
    layer.forward(at::ones({1, 2, 6}));
  });
  EXPECT_THAT(message, HasSubstr("tensor-parallel all-gather of the input's sequence shards of "
                                 "layer 'block' over mesh dimension 'tp' on rank 0 of 2 failed"));
  EXPECT_THAT(message, HasSubstr("timed out"));
}

}  // namespace
}  // namespace fsdp::test
