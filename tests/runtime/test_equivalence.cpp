// GPT-2 (tiny) trained with fully_shard over W thread-ranks against the single-process
// reference: 10 AdamW steps with weight decay and clipping; loss and grad norm per step within
// 1e-5 relative, every parameter within 1e-5; W = 1 bit-identical.
#include "support/gpt_case.h"
#include "support/harness.h"

#include <models/gpt2/gpt2.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

namespace fsdp::test {
namespace {

using models::GPT2Config;
using models::GPT2LMHead;
using models::GPT2LMHeadImpl;
using models::GPT2Options;

TEST(GptEquivalence, OneRankIsBitIdenticalToNoFsdp) {
  const TrainCase c = gpt_case();
  expect_bit_identical(train_reference(c), train_sharded(c, 1)[0]);
}

class GptEquivalenceW : public ::testing::TestWithParam<int> {};

TEST_P(GptEquivalenceW, MatchesSingleProcess) {
  const TrainCase c = gpt_case();
  expect_equivalent(train_reference(c), train_sharded(c, GetParam()), 1e-5, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(World, GptEquivalenceW, ::testing::Values(2, 3, 4));

TEST(GptEquivalence, MatchesSingleProcessInFloat64) {
  GptCaseOptions opt;
  opt.deferred = false;  // the model is converted to float64 before sharding
  TrainCase c = gpt_case(opt);
  c.dtype = at::kDouble;
  c.lr = 1e-2;
  expect_equivalent(train_reference(c), train_sharded(c, 4), 1e-12, 1e-12);
}

TEST(GptEquivalence, PrefetchOnIsBitIdenticalToPrefetchOff) {
  GptCaseOptions off;
  off.prefetch = 0;
  const auto without = train_sharded(gpt_case(off), 4);
  const auto with = train_sharded(gpt_case(), 4);
  for (size_t r = 0; r < with.size(); ++r) {
    EXPECT_EQ(with[r].losses, without[r].losses);
    EXPECT_EQ(with[r].grad_norms, without[r].grad_norms);
    for (const auto& [name, t] : with[r].params)
      EXPECT_TRUE(at::equal(t, without[r].params.at(name))) << name;
  }
}

TEST(GptEquivalence, WithoutReshardAfterForward) {
  GptCaseOptions opt;
  opt.reshard_after_forward = false;
  const TrainCase c = gpt_case(opt);
  expect_equivalent(train_reference(c), train_sharded(c, 2), 1e-5, 1e-5);
}

TEST(GptEquivalence, ShardingAfterConstructionEqualsDeferredInit) {
  GptCaseOptions opt;
  opt.deferred = false;
  const TrainCase c = gpt_case(opt);
  expect_equivalent(train_reference(c), train_sharded(c, 3), 1e-5, 1e-5);
}

TEST(GptEquivalence, GradientAccumulationWithoutZeroGrad) {
  GptCaseOptions opt;
  opt.accumulation = 2;
  const TrainCase c = gpt_case(opt);
  expect_equivalent(train_reference(c), train_sharded(c, 2), 1e-5, 1e-5);
}

TEST(GptEquivalence, TiedEmbeddingStaysTied) {
  TrainCase c = gpt_case();
  c.steps = 2;
  train_sharded(c, 2, [](int, const std::shared_ptr<torch::nn::Module>& m, const DeviceMesh&) {
    auto model = std::static_pointer_cast<GPT2LMHeadImpl>(m);
    EXPECT_EQ(model->lm_head->weight.unsafeGetTensorImpl(),
              model->transformer->wte->weight.unsafeGetTensorImpl());
    // One sharded copy, owned by the root.
    auto root = fsdp_module_of(*model);
    ASSERT_TRUE(root.has_value());
    int copies = 0;
    for (const auto& sp : root->sharded_parameters()) {
      if (sp.local.unsafeGetTensorImpl() == model->transformer->wte->weight.unsafeGetTensorImpl())
        ++copies;
    }
    EXPECT_EQ(copies, 1);
  });
}

TEST(GptDeferredInit, ShardsEqualTheSingleProcessInitialValues) {
  const GPT2Config config = GPT2Config::tiny();
  GPT2LMHead reference(GPT2Options(config).seed(9));
  std::map<std::string, at::Tensor> full;
  for (auto& [name, p] : unique_named_parameters(*reference)) full[name] = p.detach();
  run_ranks_in_threads(3, [&](std::shared_ptr<ProcessGroup> group) {
    DeviceMesh mesh(group);
    const auto monitor = std::make_shared<RankMonitor>();
    int blocks_built = 0;
    GPT2Options o(config);
    o.seed(9).on_block_built(
        [&](const std::string& name, const std::shared_ptr<torch::nn::Module>& block) {
          // Blocks are sharded as they are built: every earlier block is already sharded.
          EXPECT_EQ(monitor->stats().live().unsharded_param_bytes, 0);
          fully_shard(block, mesh, FullyShardOptions().observer(monitor));
          ++blocks_built;
        });
    GPT2LMHead model(o);
    fully_shard(model, mesh, FullyShardOptions().observer(monitor));
    EXPECT_EQ(blocks_built, config.n_layer);
    int compared = 0;
    for (const auto& unit : fsdp_modules_under(*model)) {
      for (const auto& sp : unit.sharded_parameters()) {
        const std::string name = unit.path().empty() ? sp.name : unit.path() + "." + sp.name;
        const at::Tensor& want = full.at(name);
        const auto& m = sp.metadata;
        const int64_t dim0 = m.global_shape.empty() ? 1 : m.global_shape[0];
        if (m.local_rows > 0) {
          EXPECT_TRUE(at::equal(sp.local.reshape({m.padded_rows, -1}).narrow(0, 0, m.local_rows),
                                want.reshape({dim0, -1}).narrow(0, m.local_offset, m.local_rows)))
              << name;
        }
        ++compared;
      }
    }
    EXPECT_EQ(compared, static_cast<int>(full.size()));
  });
}

}  // namespace
}  // namespace fsdp::test
