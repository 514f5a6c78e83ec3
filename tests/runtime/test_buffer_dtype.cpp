// MixedPrecisionPolicy.buffer_dtype (FSDP1's MixedPrecision.buffer_dtype) against a manual cast:
// the same model, unsharded, with its parameters and each unit's floating-point buffers cast
// by hand, must give the sharded model's outputs and gradients bit for bit; integer buffers,
// and buffers of a unit whose policy has no buffer_dtype, keep their dtypes; the buffers stay
// the modules' own tensors.
#include "support/harness.h"
#include "support/test_support.h"

#include <fsdp/comm/rendezvous.h>
#include <fsdp/fully_shard.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

namespace fsdp {
namespace {

// y = linear(x) * gain, with a floating-point buffer in the product and a counter beside it.
struct GainBlockImpl : torch::nn::Module {
  explicit GainBlockImpl(uint64_t seed) {
    linear = register_module("linear", torch::nn::Linear(4, 4));
    gain = register_buffer("gain", test::seeded_uniform({4}, seed, 1.0) + 1.0);
    calls = register_buffer("calls", at::zeros({1}, at::kLong));
    at::NoGradGuard no_grad;
    linear->weight.copy_(test::seeded_uniform({4, 4}, seed + 1, 0.5));
    linear->bias.copy_(test::seeded_uniform({4}, seed + 2, 0.1));
  }
  at::Tensor forward(const at::Tensor& x) { return linear(x) * gain; }
  torch::nn::Linear linear{nullptr};
  at::Tensor gain, calls;
};
TORCH_MODULE(GainBlock);

// Two blocks (units) and a root buffer added at the end.
struct GainNetImpl : torch::nn::Module {
  GainNetImpl() {
    for (int i = 0; i < 2; ++i)
      blocks.push_back(register_module("b" + std::to_string(i), GainBlock(10 * (i + 1))));
    shift = register_buffer("shift", test::seeded_uniform({4}, 99, 0.3));
  }
  at::Tensor forward(at::Tensor x) {
    for (auto& block : blocks) x = fsdp::forward(block, x);
    return x + shift;
  }
  std::vector<GainBlock> blocks;
  at::Tensor shift;
};
TORCH_MODULE(GainNet);

constexpr auto kCompute = at::kHalf;

// The blocks take param_dtype and buffer_dtype kCompute; the root casts its parameters but not
// its buffers (no buffer_dtype), so `shift` stays float32.
void shard(GainNet& net, const DeviceMesh& mesh) {
  const auto block_policy = MixedPrecisionPolicy().param_dtype(kCompute).buffer_dtype(kCompute);
  for (auto& block : net->blocks)
    fully_shard(block, mesh, FullyShardOptions().mp_policy(block_policy));
  fully_shard(net, mesh,
              FullyShardOptions().mp_policy(MixedPrecisionPolicy().param_dtype(kCompute)));
}

// The reference: the same model unsharded, cast by hand as the policies say.
GainNet manual_cast() {
  GainNet net;
  at::NoGradGuard no_grad;
  for (auto& p : net->parameters()) p.set_data(p.data().to(kCompute));
  for (auto& block : net->blocks) block->gain.set_data(block->gain.data().to(kCompute));
  return net;
}

TEST(BufferDtype, MatchesAManualCastOnEveryRank) {
  const at::Tensor x = test::seeded_uniform({3, 4}, 5, 1.0);
  GainNet reference = manual_cast();
  const at::Tensor want_out = reference->forward(x.to(kCompute));
  want_out.to(at::kFloat).sum().backward();

  run_ranks_in_threads(
      2,
      [&](std::shared_ptr<ProcessGroup> group) {
        DeviceMesh mesh(group);
        GainNet net;
        const at::Tensor gain_before = net->blocks[0]->gain;
        shard(net, mesh);
        for (auto& block : net->blocks) {
          EXPECT_EQ(block->gain.scalar_type(), kCompute);
          EXPECT_EQ(block->calls.scalar_type(), at::kLong);  // not floating point: untouched
        }
        EXPECT_EQ(net->shift.scalar_type(), at::kFloat);  // the root's policy has no buffer_dtype
        // Cast in place: the module's registered buffer is the same tensor as before.
        EXPECT_TRUE(net->blocks[0]->named_buffers()["gain"].is_same(gain_before));
        EXPECT_EQ(gain_before.scalar_type(), kCompute);

        // Every rank computes the whole batch, so the averaged gradient is the reference's.
        const at::Tensor out = fsdp::forward(net, x);
        EXPECT_EQ(out.scalar_type(), at::kFloat);  // fp16 + the root's fp32 buffer
        EXPECT_TRUE(at::equal(out, want_out)) << (out - want_out).abs().max();
        out.to(at::kFloat).sum().backward();
        // Each rank's gradient shard equals the reference's rows (fp16, exact in fp32).
        for (const FSDPModule& unit : fsdp_modules_under(*net)) {
          for (const ShardedParameter& p : unit.sharded_parameters()) {
            const std::string name = unit.path().empty() ? p.name : unit.path() + "." + p.name;
            const at::Tensor want = reference->named_parameters()[name].grad().to(at::kFloat);
            const at::Tensor rows = want.narrow(0, p.metadata.local_offset, p.metadata.local_rows);
            const at::Tensor got = p.local.grad().narrow(0, 0, p.metadata.local_rows);
            EXPECT_TRUE(at::equal(got, rows)) << name << " on rank " << group->rank();
          }
        }
      },
      test::test_options());
}

TEST(BufferDtype, ANonFloatingDtypeIsRefused) {
  run_ranks_in_threads(1, [](std::shared_ptr<ProcessGroup> group) {
    DeviceMesh mesh(group);
    GainBlock block(1);
    EXPECT_THAT(test::error_message([&] {
                  fully_shard(
                      block, mesh,
                      FullyShardOptions().mp_policy(MixedPrecisionPolicy().buffer_dtype(at::kInt)));
                }),
                ::testing::HasSubstr("buffer_dtype must be a floating-point dtype, got Int"));
    EXPECT_EQ(block->gain.scalar_type(), at::kFloat);  // refused before anything changed
  });
}

}  // namespace
}  // namespace fsdp
