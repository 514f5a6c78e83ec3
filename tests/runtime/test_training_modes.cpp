// Training modes against the single-process reference: mixed precision (bf16 compute from fp32
// master weights) and the gradient-accumulation controls, with their communication counts, and
// the errors for bad settings.
#include "support/gpt_case.h"
#include "support/harness.h"
#include "support/test_support.h"

#include <fsdp/fully_shard.h>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

namespace fsdp::test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(MixedPrecision, Bf16MatchesSingleProcessBf16ComputeWithFp32Masters) {
  GptCaseOptions opt;
  opt.mp_policy.param_dtype(at::kBFloat16).reduce_dtype(at::kFloat);
  const TrainCase c = gpt_case(opt);
  const TrainRecord reference = train_reference_mixed(c, at::kBFloat16);
  const auto ranks =
      train_sharded(c, 4, [](int, const std::shared_ptr<torch::nn::Module>& m, const DeviceMesh&) {
        // Master weights and their gradients stay fp32.
        for (const auto& p : unique_parameters(*m)) {
          EXPECT_EQ(p.scalar_type(), at::kFloat);
          if (p.grad().defined()) EXPECT_EQ(p.grad().scalar_type(), at::kFloat);
        }
      });
  // bf16 has 8 bits of mantissa: 2e-2 relative on the loss and gradient norm, and 1e-2 on the
  // weights (10 steps of lr 1e-3).
  expect_equivalent(reference, ranks, 2e-2, 1e-2);
}

TEST(MixedPrecision, AllGatherMovesHalfTheBytesInBf16) {
  std::map<std::string, int64_t> gathered;
  for (const bool bf16 : {false, true}) {
    GptCaseOptions opt;
    if (bf16) opt.mp_policy.param_dtype(at::kBFloat16);
    TrainCase c = gpt_case(opt);
    c.steps = 1;
    run_ranks_in_threads(4, [&](std::shared_ptr<ProcessGroup> group) {
      DeviceMesh mesh(group);
      auto model = c.make_model(&mesh);
      c.shard(model, mesh);
      auto [x, y] = c.batch(0);
      group->reset_counters();
      c.loss(model, x.narrow(0, 3 * group->rank(), 3), y.narrow(0, 3 * group->rank(), 3))
          .backward();
      if (group->rank() == 0)
        gathered[bf16 ? "bf16" : "fp32"] = group->counters().all_gather.payload_bytes;
    });
  }
  EXPECT_GT(gathered["fp32"], 0);
  EXPECT_EQ(2 * gathered["bf16"], gathered["fp32"]);
}

// --- gradient accumulation: K micro-batches per step equal the reference's global batch ---

enum class AccumMode { kSync, kNoSync, kNoReshard };

TrainCase accumulation_case(AccumMode mode, int k) {
  GptCaseOptions opt;
  opt.accumulation = k;
  TrainCase c = gpt_case(opt);
  c.before_micro_batch = [mode, k](const std::shared_ptr<torch::nn::Module>& m, int micro) {
    FSDPModule root = *fsdp_module_of(*m);
    const bool last = micro == k - 1;
    if (mode == AccumMode::kNoSync || mode == AccumMode::kNoReshard)
      root.set_requires_gradient_sync(last);
    if (mode == AccumMode::kNoReshard) {
      // Keep every unit gathered from the first forward to the last backward.
      root.set_reshard_after_forward(false);
      root.set_reshard_after_backward(last);
    }
  };
  return c;
}

class Accumulation : public ::testing::TestWithParam<AccumMode> {};

TEST_P(Accumulation, EqualsTheReferenceWithTheSameGlobalBatch) {
  const TrainCase c = accumulation_case(GetParam(), 3);
  expect_equivalent(train_reference(c), train_sharded(c, 2), 1e-5, 1e-5);
}

TEST_P(Accumulation, CommunicationCountsPerStep) {
  constexpr int kMicro = 3;
  const AccumMode mode = GetParam();
  TrainCase c = accumulation_case(mode, kMicro);
  c.steps = 2;
  const int units = 1 + 2;  // root + two blocks (tiny)
  train_sharded(
      c, 2, [&](int, const std::shared_ptr<torch::nn::Module>& m, const DeviceMesh& mesh) {
        const CommCounters counters = mesh.shard_group().counters();
        mesh.shard_group().reset_counters();
        switch (mode) {
          case AccumMode::kSync:  // every micro-batch gathers (blocks twice) and reduces
            EXPECT_EQ(counters.all_gather.calls, kMicro * (units + 2));
            EXPECT_EQ(counters.reduce_scatter.calls, kMicro * units);
            break;
          case AccumMode::kNoSync:  // gathers as usual, one reduce-scatter per unit per step
            EXPECT_EQ(counters.all_gather.calls, kMicro * (units + 2));
            EXPECT_EQ(counters.reduce_scatter.calls, units);
            break;
          case AccumMode::kNoReshard:  // one all-gather and one reduce-scatter per unit per step
            EXPECT_EQ(counters.all_gather.calls, units);
            EXPECT_EQ(counters.reduce_scatter.calls, units);
            break;
        }
        // Nothing stays unsharded once the step's last backward resharded.
        EXPECT_EQ(stats_of(*m).live().unsharded_units, 0);
      });
}

INSTANTIATE_TEST_SUITE_P(Modes, Accumulation,
                         ::testing::Values(AccumMode::kSync, AccumMode::kNoSync,
                                           AccumMode::kNoReshard),
                         [](const auto& info) {
                           switch (info.param) {
                             case AccumMode::kSync:
                               return std::string("Sync");
                             case AccumMode::kNoSync:
                               return std::string("NoSync");
                             default:
                               return std::string("NoReshard");
                           }
                         });

// --- sharding strategies at W = 4: ZeRO-3, ZeRO-2, DDP, HSDP 2 x 2 ---

struct Strategy {
  const char* name;
  int replicate;                              // mesh replicate dimension
  ReshardAfterForward reshard_after_forward;  // for the blocks
  // Whether backward gathers the blocks again, and over how many ranks (hpZ: fewer than the
  // shard group).
  bool regathers() const { return reshard_after_forward.group_size(4 / replicate) > 1; }
};
const Strategy kStrategies[] = {{"full_shard", 1, true},
                                {"shard_grad_op", 1, false},
                                {"no_shard", 4, true},
                                {"hybrid_shard", 2, true},
                                {"full_shard_hpz2", 1, 2}};

class Strategies : public ::testing::TestWithParam<Strategy> {};

TrainCase strategy_case(const Strategy& s) {
  GptCaseOptions opt;
  opt.reshard_after_forward = s.reshard_after_forward;
  TrainCase c = gpt_case(opt);
  c.replicate = s.replicate;
  return c;
}

TEST_P(Strategies, MatchesSingleProcess) {
  const TrainCase c = strategy_case(GetParam());
  expect_equivalent(train_reference(c), train_sharded(c, 4), 1e-5, 1e-5);
}

TEST_P(Strategies, BytesHeldAndMovedMatchTheAnalyticCounts) {
  const Strategy s = GetParam();
  TrainCase c = strategy_case(s);
  c.steps = 1;
  const int shard = 4 / s.replicate;
  // Padded full-model bytes for a shard group of `shard` ranks, and the blocks' share.
  auto model = c.make_model(nullptr);
  int64_t padded = 0, padded_blocks = 0, full = 0;
  for (const auto& [name, p] : unique_named_parameters(*model)) {
    const int64_t dim0 = p.dim() == 0 ? 1 : p.size(0);
    const int64_t bytes = (dim0 + shard - 1) / shard * shard * (p.numel() / dim0) * 4;
    padded += bytes;
    if (name.rfind("transformer.h.", 0) == 0) padded_blocks += bytes;
    full += p.nbytes();
  }
  train_sharded(
      c, 4, [&](int, const std::shared_ptr<torch::nn::Module>& m, const DeviceMesh& mesh) {
        int64_t param_bytes = 0;
        for (const auto& p : unique_parameters(*m)) param_bytes += p.nbytes();
        EXPECT_EQ(param_bytes, padded / shard) << s.name;
        if (shard == 1) EXPECT_EQ(param_bytes, full) << s.name;
        const CommCounters n = mesh.counters();
        const int64_t regathered = s.regathers() ? padded_blocks : 0;
        EXPECT_EQ(n.all_gather.payload_bytes, shard == 1 ? 0 : padded + regathered) << s.name;
        // hpZ: the shard group gathers once, in forward; backward gathers in the groups of 2.
        const int post_forward = s.reshard_after_forward.group_size(shard);
        const int64_t in_shard_group = post_forward < shard ? padded : padded + regathered;
        EXPECT_EQ(mesh.shard_group().counters().all_gather.payload_bytes,
                  shard == 1 ? 0 : in_shard_group)
            << s.name;
        EXPECT_EQ(n.reduce_scatter.payload_bytes, shard == 1 ? 0 : padded) << s.name;
        EXPECT_EQ(n.reduce_scatter.sent_bytes, shard == 1 ? 0 : padded / shard * (shard - 1))
            << s.name;
        // Across replicas each rank all-reduces its reduced shard once. Besides: the gradient norm
        // (8 bytes, on the shard group when it has more than one rank) and, on a 1-D mesh whose
        // group is the world, the harness's loss average (4 bytes).
        const int64_t norm = shard > 1 ? 8 : 0;
        const int64_t loss = s.replicate == 1 ? 4 : 0;
        const int64_t grads = s.replicate == 1 ? 0 : padded / shard;
        EXPECT_EQ(n.all_reduce.payload_bytes, grads + norm + loss) << s.name;
      });
}

INSTANTIATE_TEST_SUITE_P(W4, Strategies, ::testing::ValuesIn(kStrategies),
                         [](const auto& info) { return std::string(info.param.name); });

// --- hpZ: reshard_after_forward as an int ---

// What the backward of an hpZ run gathers is bit for bit what full_shard gathers, so the two
// train identically: fp32, and bf16 (whose pieces are kept in bf16).
TEST(ReshardToSmallerGroup, TrainsExactlyLikeFullShard) {
  for (const bool bf16 : {false, true}) {
    GptCaseOptions opt;
    if (bf16) opt.mp_policy.param_dtype(at::kBFloat16).reduce_dtype(at::kFloat);
    opt.reshard_after_forward = true;
    const std::vector<TrainRecord> full = train_sharded(gpt_case(opt), 4);
    opt.reshard_after_forward = 2;
    const std::vector<TrainRecord> hpz = train_sharded(gpt_case(opt), 4);
    for (int r = 0; r < 4; ++r) expect_bit_identical(full[r], hpz[r]);
  }
}

// Between forward and backward a block holds W/N of the W padded shards of its unit (in the
// compute dtype), and nothing once backward has gathered from them; the sizes 1 and W act as
// false and true.
TEST(ReshardToSmallerGroup, HoldsItsPieceBetweenForwardAndBackward) {
  for (const int size : {1, 2, 4}) {
    run_ranks_in_threads(4, [size](std::shared_ptr<ProcessGroup> group) {
      DeviceMesh mesh(group);
      GptCaseOptions opt;
      opt.reshard_after_forward = size;
      TrainCase c = gpt_case(opt);
      auto model = c.make_model(&mesh);
      c.shard(model, mesh);
      observe_with(*model, std::make_shared<RankMonitor>());
      int64_t root_bytes = 0, block_shards = 0, block_full = 0;
      for (const FSDPModule& unit : fsdp_modules_under(*model)) {
        for (const ShardedParameter& p : unit.sharded_parameters()) {
          const int64_t full = p.local.numel() / p.metadata.padded_rows *
                               (p.metadata.global_shape.empty() ? 1 : p.metadata.global_shape[0]);
          if (unit.path().empty()) {
            root_bytes += full * 4;
          } else {
            block_shards += p.local.nbytes();
            block_full += full * 4;
          }
        }
      }
      const int64_t kept = size == 1 ? block_full : size == 4 ? 0 : block_shards * (4 / size);
      auto [x, y] = c.batch(0);
      const int rank = group->rank();
      at::Tensor loss = c.loss(model, x.narrow(0, 3 * rank, 3), y.narrow(0, 3 * rank, 3));
      EXPECT_EQ(stats_of(*model).live().unsharded_param_bytes, root_bytes + kept)
          << "size " << size;
      mesh.reset_counters();
      loss.backward();
      EXPECT_EQ(stats_of(*model).live().unsharded_param_bytes, 0) << "size " << size;
      // Backward gathers the blocks from their pieces: within the groups of `size`.
      const int64_t padded_blocks = block_shards * 4;
      EXPECT_EQ(mesh.counters().all_gather.payload_bytes, size == 1 ? 0 : padded_blocks);
      EXPECT_EQ(mesh.shard_group().counters().all_gather.payload_bytes,
                size == 4 ? padded_blocks : 0);
    });
  }
}

// --- bad settings ---

TEST(TrainingModeErrors, ReshardGroupSizeThatDoesNotDivideTheShardGroup) {
  run_ranks_in_threads(4, [](std::shared_ptr<ProcessGroup> group) {
    DeviceMesh mesh(group);
    torch::nn::Linear linear(8, 3);
    for (const int size : {3, 0, 8}) {
      EXPECT_THAT(test::error_message([&] {
                    fully_shard(linear, mesh, FullyShardOptions().reshard_after_forward(size));
                  }),
                  AllOf(HasSubstr("reshard_after_forward=" + std::to_string(size)),
                        HasSubstr("does not divide the shard group of 4 ranks")));
    }
  });
}

TEST(TrainingModeErrors, UnsupportedDtypeForTheBackend) {
  run_ranks_in_threads(1, [](std::shared_ptr<ProcessGroup> group) {
    DeviceMesh mesh(group);
    torch::nn::Linear linear(4, 3);
    FullyShardOptions options;
    options.mp_policy(MixedPrecisionPolicy().param_dtype(at::kInt));
    EXPECT_THAT(test::error_message([&] { fully_shard(linear, mesh, options); }),
                AllOf(HasSubstr("param_dtype is Int"), HasSubstr("gloo")));
    options.mp_policy(MixedPrecisionPolicy().reduce_dtype(at::kFloat8_e4m3fn));
    EXPECT_THAT(test::error_message([&] { fully_shard(linear, mesh, options); }),
                AllOf(HasSubstr("reduce_dtype is Float8_e4m3fn"), HasSubstr("gloo")));
  });
}

TEST(TrainingModeErrors, ReplicateSizeThatDoesNotDivideTheWorld) {
  run_ranks_in_threads(4, [](std::shared_ptr<ProcessGroup> group) {
    EXPECT_THAT(test::error_message([&] { DeviceMesh::hybrid(group, 3); }),
                HasSubstr("replicate size 3 does not divide the world size 4"));
  });
}

TEST(TrainingModeErrors, ChangingSyncSettingsDuringBackward) {
  run_ranks_in_threads(2, [](std::shared_ptr<ProcessGroup> group) {
    DeviceMesh mesh(group);
    TrainCase c = gpt_case();
    auto model = c.make_model(&mesh);
    c.shard(model, mesh);
    FSDPModule root = *fsdp_module_of(*model);
    auto [x, y] = c.batch(0);
    at::Tensor loss =
        c.loss(model, x.narrow(0, 6 * group->rank(), 6), y.narrow(0, 6 * group->rank(), 6));
    loss.register_hook(
        [root](const at::Tensor&) { FSDPModule(root).set_requires_gradient_sync(false); });
    EXPECT_THAT(test::error_message([&] { loss.backward(); }),
                AllOf(HasSubstr("set_requires_gradient_sync(false)"),
                      HasSubstr("while a backward pass is running")));
  });
}

}  // namespace
}  // namespace fsdp::test
