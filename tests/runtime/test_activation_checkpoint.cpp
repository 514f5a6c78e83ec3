// Activation checkpointing (include/fsdp/activation_checkpoint.h): the same numbers as without
// it, in one process bit for bit and under FSDP within float tolerance; gradients for
// parameters whose inputs need none; replayed randomness; and the bytes autograd keeps.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fsdp/activation_checkpoint.h>
#include <fsdp/comm/rendezvous.h>
#include <fsdp/fully_shard.h>
#include <fsdp/util/memory_counter.h>
#include <gtest/gtest.h>
#include <models/gpt2/gpt2.h>
#include <torch/nn/modules/linear.h>

#include <thread>

#include "support/gpt_case.h"
#include "support/harness.h"

namespace fsdp::test {
namespace {

using models::GPT2LMHeadImpl;

// The case with every block's forward checkpointed.
TrainCase checkpointed(TrainCase c) {
  auto make = c.make_model;
  c.make_model = [make](const DeviceMesh* mesh) {
    auto model = make(mesh);
    for (auto& block : std::static_pointer_cast<GPT2LMHeadImpl>(model)->transformer->blocks) {
      block->set_activation_checkpoint(true);
    }
    return model;
  };
  return c;
}

TEST(ActivationCheckpoint, GradientsBitIdenticalInOneProcess) {
  const TrainCase plain = gpt_case();
  const TrainCase ckpt = checkpointed(plain);
  auto a = plain.make_model(nullptr);
  auto b = ckpt.make_model(nullptr);
  auto [x, y] = plain.batch(0);
  const at::Tensor loss_a = plain.loss(a, x, y);
  const at::Tensor loss_b = ckpt.loss(b, x, y);
  EXPECT_TRUE(at::equal(loss_a, loss_b));
  loss_a.backward();
  loss_b.backward();
  const auto pa = unique_named_parameters(*a);
  const auto pb = unique_named_parameters(*b);
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    ASSERT_TRUE(pb[i].second.grad().defined()) << pb[i].first;
    EXPECT_TRUE(at::equal(pa[i].second.grad(), pb[i].second.grad())) << pa[i].first;
  }
}

TEST(ActivationCheckpoint, TrainingBitIdenticalInOneProcess) {
  TrainCase plain = gpt_case();
  plain.steps = 4;
  expect_bit_identical(train_reference(plain), train_reference(checkpointed(plain)));
}

TEST(ActivationCheckpoint, FsdpOneRankBitIdenticalToPlainReference) {
  TrainCase plain = gpt_case();
  plain.steps = 4;
  expect_bit_identical(train_reference(plain), train_sharded(checkpointed(plain), 1)[0]);
}

// The recompute runs inside each block's backward, after FSDP's pre-backward hook gathered the
// block again (with sharded parameters it would fail on their shapes), and the gradients it
// produces are reduce-scattered as usual.
TEST(ActivationCheckpoint, FsdpTwoRanksMatchSingleProcess) {
  const TrainCase plain = gpt_case();
  expect_equivalent(train_reference(plain), train_sharded(checkpointed(plain), 2), 1e-5, 1e-5);
}

TEST(ActivationCheckpoint, ShardGradOpMatchesSingleProcess) {
  GptCaseOptions opt;
  opt.reshard_after_forward = false;
  TrainCase plain = gpt_case(opt);
  plain.steps = 4;
  expect_equivalent(train_reference(plain), train_sharded(checkpointed(plain), 2), 1e-5, 1e-5);
}

// A unit whose forward body is checkpointed records the weight it sees each time the body runs.
class ProbeImpl : public torch::nn::Module {
 public:
  ProbeImpl() { linear = register_module("linear", torch::nn::Linear(4, 6)); }
  at::Tensor forward(const at::Tensor& x) {
    return activation_checkpoint(
        [this](const at::Tensor& in) {
          rows_seen.push_back(linear->weight.size(0));
          grad_mode_seen.push_back(at::GradMode::is_enabled());
          return at::tanh(linear->forward(in));
        },
        x);
  }
  torch::nn::Linear linear{nullptr};
  std::vector<int64_t> rows_seen;
  std::vector<bool> grad_mode_seen;
};
TORCH_MODULE(Probe);

class ParentImpl : public torch::nn::Module {
 public:
  ParentImpl() {
    head = register_module("head", torch::nn::Linear(6, 2));
    probe = register_module("probe", Probe());
  }
  at::Tensor forward(const at::Tensor& x) { return head->forward(fsdp::forward(probe, x)); }
  torch::nn::Linear head{nullptr};
  Probe probe{nullptr};
};
TORCH_MODULE(Parent);

// The probe unit reshards after forward; its recompute must run after FSDP's pre-backward hook
// gathered it again, with grad mode on, and see the full weight (6 rows, not a 3-row shard).
TEST(ActivationCheckpoint, RecomputeSeesTheParametersFsdpGatheredForBackward) {
  run_ranks_in_threads(2, [](std::shared_ptr<ProcessGroup> group) {
    DeviceMesh mesh(group);
    Parent parent;
    fully_shard(parent->probe, mesh);
    fully_shard(parent, mesh);
    const at::Tensor x = seeded_uniform({3, 4}, 11 + group->rank());
    at::Tensor loss = fsdp::forward(parent, x).sum();
    EXPECT_EQ(parent->probe->linear->weight.size(0), 3) << "resharded after forward";
    loss.backward();
    EXPECT_EQ(parent->probe->rows_seen, (std::vector<int64_t>{6, 6}));
    EXPECT_EQ(parent->probe->grad_mode_seen, (std::vector<bool>{false, true}));
    ASSERT_TRUE(parent->probe->linear->weight.grad().defined());
    EXPECT_EQ(parent->probe->linear->weight.grad().size(0), 3) << "reduce-scattered to the shard";
  });
}

// No input requires grad, yet the parameters used inside get their gradients.
TEST(ActivationCheckpoint, ParametersGetGradientsWhenNoInputNeedsOne) {
  torch::nn::Linear plain(4, 3), ckpt(4, 3);
  {
    at::NoGradGuard no_grad;
    ckpt->weight.copy_(plain->weight);
    ckpt->bias.copy_(plain->bias);
  }
  const at::Tensor x = seeded_uniform({5, 4}, 1);
  at::tanh(plain->forward(x)).sum().backward();
  const at::Tensor out =
      activation_checkpoint([&](const at::Tensor& in) { return at::tanh(ckpt->forward(in)); }, x);
  ASSERT_TRUE(out.requires_grad());
  out.sum().backward();
  ASSERT_TRUE(ckpt->weight.grad().defined());
  EXPECT_TRUE(at::equal(plain->weight.grad(), ckpt->weight.grad()));
  EXPECT_TRUE(at::equal(plain->bias.grad(), ckpt->bias.grad()));
}

// Several inputs and outputs, an undefined input, and input gradients.
TEST(ActivationCheckpoint, SeveralInputsAndOutputs) {
  const at::Tensor a0 = seeded_uniform({3, 4}, 2).requires_grad_(true);
  const at::Tensor b0 = seeded_uniform({3, 4}, 3).requires_grad_(true);
  auto fn = [](const std::vector<at::Tensor>& in) {
    EXPECT_FALSE(in[2].defined());
    return std::vector<at::Tensor>{in[0] * in[1], at::sin(in[0]) + in[1]};
  };
  auto ref = fn({a0, b0, at::Tensor()});
  (ref[0].sum() * 2 + ref[1].pow(2).sum()).backward();
  const at::Tensor ga = a0.grad().clone(), gb = b0.grad().clone();
  a0.mutable_grad() = at::Tensor();
  b0.mutable_grad() = at::Tensor();
  auto out = activation_checkpoint(fn, {a0, b0, at::Tensor()});
  (out[0].sum() * 2 + out[1].pow(2).sum()).backward();
  EXPECT_TRUE(at::equal(a0.grad(), ga));
  EXPECT_TRUE(at::equal(b0.grad(), gb));
}

// Dropout inside the region: the recompute draws the same mask as forward when the generator
// state is preserved (the default), and a different one when it is not.
TEST(ActivationCheckpoint, ReplaysTheRandomStream) {
  const at::Tensor w0 = seeded_uniform({64}, 4);
  auto run = [&](int mode) {  // 0: plain, 1: checkpoint, 2: checkpoint without rng replay
    at::Tensor w = w0.clone().requires_grad_(true);
    auto fn = [&](const at::Tensor& x) { return at::dropout(x * w, 0.5, /*train=*/true); };
    at::manual_seed(123);
    const at::Tensor x = at::ones({8, 64});
    at::Tensor out = mode == 0
                         ? fn(x)
                         : activation_checkpoint(
                               fn, x, ActivationCheckpointOptions().preserve_rng_state(mode == 1));
    at::manual_seed(999);  // the stream moves on before backward
    out.pow(2).sum().backward();
    return w.grad();
  };
  const at::Tensor reference = run(0);
  EXPECT_TRUE(at::equal(run(1), reference));
  EXPECT_FALSE(at::equal(run(2), reference));
}

TEST(ActivationCheckpoint, WithoutGradModeIsAPlainCall) {
  torch::nn::Linear linear(4, 3);
  at::NoGradGuard no_grad;
  const at::Tensor x = seeded_uniform({2, 4}, 5);
  const at::Tensor out =
      activation_checkpoint([&](const at::Tensor& in) { return linear->forward(in); }, x);
  EXPECT_FALSE(out.requires_grad());
  EXPECT_TRUE(at::equal(out, linear->forward(x)));
}

// Bytes autograd keeps after forward, measured with the counting allocator: with checkpointing,
// a block keeps its input only.
TEST(ActivationCheckpoint, KeepsLessForBackward) {
  const models::GPT2Config config = models::GPT2Config::tiny();
  auto saved_bytes = [&](bool ckpt) { return gpt2_bytes_kept_for_backward(config, 8, 64, ckpt); };
  const int64_t plain = saved_bytes(false);
  const int64_t ckpt = saved_bytes(true);
  // Tiny: 2 blocks of ~16 [B, T, d] tensors each against one; the root's share is the same.
  const int64_t btd = 8 * 64 * 32 * 4;
  EXPECT_GT(plain - ckpt, 2 * 13 * btd) << "plain " << plain << " checkpointed " << ckpt;
}

// --- the counting allocator ---

TEST(MemoryCounter, CountsLiveAndPeakBytesPerThread) {
  auto counter = std::make_shared<MemoryCounter>();
  at::Tensor kept;
  {
    CountAllocations count(counter);
    at::Tensor a = at::empty({1000}, at::kFloat);
    kept = at::empty({250}, at::kDouble);
    EXPECT_EQ(counter->live_bytes(), 4000 + 2000);
  }
  EXPECT_EQ(counter->live_bytes(), 2000);
  EXPECT_EQ(counter->peak_bytes(), 6000);
  at::Tensor uncounted = at::empty({100});  // no guard on this thread now
  EXPECT_EQ(counter->live_bytes(), 2000);
  // Freed on another thread: charged back to the counter that paid.
  std::thread([t = std::move(kept)]() mutable { t = at::Tensor(); }).join();
  EXPECT_EQ(counter->live_bytes(), 0);
  counter->reset_peak();
  EXPECT_EQ(counter->peak_bytes(), 0);
  EXPECT_TRUE(cpu_memory_counter_installed());
}

}  // namespace
}  // namespace fsdp::test
