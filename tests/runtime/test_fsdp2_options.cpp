// FSDP2's per-unit options against their references: set_gradient_divide_factor and
// set_force_sum_reduction_for_comms (the divide rules against FSDP2's own function, the ops the
// backend sees, training against the single process), set_requires_all_reduce (HSDP
// accumulation), set_all_reduce_hook (a hand-made HSDP), set_unshard_in_backward and
// ignored_params; and the errors for bad settings.
#include "runtime/gradient_reduction.h"
#include "support/files.h"
#include "support/forwarding_group.h"
#include "support/gpt_case.h"
#include "support/harness.h"
#include "support/test_support.h"

#include <fsdp/checkpoint/checkpoint.h>
#include <fsdp/checkpoint/safetensors.h>
#include <fsdp/clip_grad.h>
#include <fsdp/fully_shard.h>
#include <fsdp/runtime/whole_tensor.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>

namespace fsdp::test {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// --- the divide rules, against FSDP2's _get_gradient_divide_factors ---

// Runs FSDP2's function in the reference python over a grid of settings and compares each
// answer with plan_gradient_reduction. A PreMulSum(1/F) op is our pre_scale 1/F with kSum.
TEST(GradientDivideRules, MatchFsdp2sFunction) {
  const std::string script = R"PY(
import json, torch, torch.distributed as dist
from torch.distributed.fsdp._fully_shard._fsdp_collectives import _get_gradient_divide_factors as f
class G:
    def __init__(self, n): self.n = n
    def size(self): return self.n
out = []
for shard, rep in [(1, 1), (2, 1), (4, 1), (3, 1), (2, 2), (1, 4), (2, 3)]:
    for dtype in ["fp32", "bf16", "fp16", "fp64"]:
        for factor in [None, 1.0, 2.0, 3.0, 8.0, 0.5]:
            for force in [False, True]:
                d = dict(fp32=torch.float32, bf16=torch.bfloat16, fp16=torch.float16, fp64=torch.float64)[dtype]
                pre, post, rs, ar = f(G(shard), G(rep) if rep > 1 else None, d, "cpu", factor, force)
                def op(o):
                    if o == dist.ReduceOp.SUM: return ["sum", 1.0]
                    if o == dist.ReduceOp.AVG: return ["avg", 1.0]
                    return ["premul", 1.0 / factor]
                out.append(dict(shard=shard, rep=rep, dtype=dtype, factor=factor, force=force,
                                pre=pre, post=post, rs=op(rs), ar=op(ar)))
print(json.dumps(out))
)PY";
  const std::string path = temp_path("divide_rules.py");
  { std::ofstream(path) << script; }
  const ReferenceResult r = run_reference(reference_python(), {path, "", {}, {}});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto cases = nlohmann::json::parse(r.output.substr(r.output.find('[')));
  ASSERT_GT(cases.size(), 300u);
  const std::map<std::string, at::ScalarType> dtypes = {
      {"fp32", at::kFloat}, {"bf16", at::kBFloat16}, {"fp16", at::kHalf}, {"fp64", at::kDouble}};
  auto op_name = [](ReduceOp op) { return op == ReduceOp::kAvg ? "avg" : "sum"; };
  for (const auto& c : cases) {
    std::optional<double> factor;
    if (!c["factor"].is_null()) factor = c["factor"].get<double>();
    const int shard = c["shard"], rep = c["rep"];
    const detail::GradientReduction plan = detail::plan_gradient_reduction(
        shard, rep, dtypes.at(c["dtype"]), factor, c["force"].get<bool>());
    std::ostringstream where;
    where << c.dump();
    // FSDP2's pre-divide p is our pre_scale 1/p; a PreMulSum's 1/F also lands in pre_scale.
    double want_pre_scale = c["pre"].is_null() ? 1.0 : 1.0 / c["pre"].get<double>();
    std::string want_rs = c["rs"][0];
    if (want_rs == "premul") {
      want_pre_scale *= c["rs"][1].get<double>();
      want_rs = "sum";
    }
    // With one rank in the shard group FSDP2 does no reduce-scatter: the op is unused.
    if (shard > 1) EXPECT_EQ(op_name(plan.reduce_scatter_op), want_rs) << where.str();
    if (rep > 1)
      EXPECT_EQ(op_name(plan.all_reduce_op), c["ar"][0].get<std::string>()) << where.str();
    // One shard rank: FSDP2 divides the copied input by the factor once more (a quirk of its
    // world-size-1 path); we apply the factor once, as every other shape does.
    if (shard == 1 && factor.has_value() && want_rs == "sum" && c["rs"][0] != "premul") continue;
    if (shard == 1 && factor.has_value() && c["rs"][0] == "premul") {
      EXPECT_DOUBLE_EQ(plan.pre_scale, want_pre_scale) << where.str();
      continue;
    }
    EXPECT_DOUBLE_EQ(plan.pre_scale, want_pre_scale) << where.str();
    EXPECT_DOUBLE_EQ(plan.post_divide, c["post"].is_null() ? 1.0 : c["post"].get<double>())
        << where.str();
  }
}

// --- a ProcessGroup that records the reduce ops the backend is asked for ---

struct OpLog {
  std::mutex mutex;
  std::vector<std::string> ops;  // "reduce_scatter:sum", "all_reduce:avg", ...
  void add(const char* kind, ReduceOp op) {
    std::lock_guard<std::mutex> lock(mutex);
    ops.push_back(std::string(kind) + (op == ReduceOp::kAvg ? ":avg" : ":sum"));
  }
};

class OpRecordingGroup : public ForwardingGroup {
 public:
  OpRecordingGroup(std::shared_ptr<ProcessGroup> inner, std::shared_ptr<OpLog> log)
      : ForwardingGroup(std::move(inner)), log_(std::move(log)) {}
  WorkHandle reduce_scatter_tensor(const at::Tensor& out, const at::Tensor& in,
                                   ReduceOp op) override {
    if (log_) log_->add("reduce_scatter", op);
    return inner().reduce_scatter_tensor(out, in, op);
  }
  WorkHandle all_reduce(const at::Tensor& t, ReduceOp op) override {
    // Gradient norms and the harness's loss average also all-reduce (scalars); only gradient
    // buffers are logged.
    if (log_ && t.numel() > 1) log_->add("all_reduce", op);
    return inner().all_reduce(t, op);
  }

 private:
  std::shared_ptr<ProcessGroup> wrap_split(std::shared_ptr<ProcessGroup> inner) override {
    return std::make_shared<OpRecordingGroup>(std::move(inner), log_);
  }
  std::shared_ptr<OpLog> log_;  // null: record nothing (every rank but 0)
};

struct ReduceSettings {
  std::optional<double> factor;
  bool force_sum = false;
};

void apply_reduce_settings(const ReduceSettings& s,
                           const std::shared_ptr<torch::nn::Module>& model) {
  for (FSDPModule unit : fsdp_modules_under(*model)) {
    if (s.factor) unit.set_gradient_divide_factor(*s.factor);
    unit.set_force_sum_reduction_for_comms(s.force_sum);
  }
}

// The ops rank 0's groups were asked for in one forward and backward of the tiny GPT-2 on a
// replicate x (4 / replicate) mesh.
std::vector<std::string> ops_of_one_step(int replicate, const ReduceSettings& s) {
  auto log = std::make_shared<OpLog>();
  run_ranks_in_threads(4, [&](std::shared_ptr<ProcessGroup> group) {
    auto recorded = std::make_shared<OpRecordingGroup>(group, group->rank() == 0 ? log : nullptr);
    const DeviceMesh mesh = DeviceMesh::hybrid(recorded, replicate);
    const TrainCase c = gpt_case();
    auto model = c.make_model(&mesh);
    c.shard(model, mesh);
    apply_reduce_settings(s, model);
    auto [x, y] = c.batch(0);
    c.loss(model, x.narrow(0, 3 * group->rank(), 3), y.narrow(0, 3 * group->rank(), 3)).backward();
  });
  return log->ops;
}

TEST(ForceSumReduction, EveryGradientCollectiveSums) {
  using ::testing::Each;
  using ::testing::SizeIs;
  const int units = 3;  // tiny: two blocks and the root
  for (const int replicate : {1, 2, 4}) {
    const auto defaults = ops_of_one_step(replicate, {});
    const auto forced = ops_of_one_step(replicate, {std::nullopt, true});
    const auto factor = ops_of_one_step(replicate, {3.0, false});
    const int per_unit = replicate == 1 || replicate == 4 ? 1 : 2;  // HSDP: RS + AR
    EXPECT_THAT(defaults, SizeIs(units * per_unit)) << "replicate " << replicate;
    EXPECT_THAT(forced, SizeIs(units * per_unit)) << "replicate " << replicate;
    // FSDP2's default for fp32 lets the collectives average; force-sum makes every one a sum.
    EXPECT_THAT(defaults, Each(HasSubstr(":avg"))) << "replicate " << replicate;
    EXPECT_THAT(forced, Each(HasSubstr(":sum"))) << "replicate " << replicate;
    // An explicit factor other than the shard size premultiplies and sums, and the all-reduce
    // across replicas sums.
    EXPECT_THAT(factor, Each(HasSubstr(":sum"))) << "replicate " << replicate;
  }
}

// --- training with the divide settings against the single process ---

// The single-process reference for a divide factor F over D data-parallel ranks: the sharded
// gradient is the sum over ranks divided by F, i.e. the mean gradient times D / F. The
// reference's loss keeps its value and carries D / F into backward (its gradient seed).
TrainCase divide_case(int data_parallel, std::optional<double> factor, int accumulation = 1) {
  GptCaseOptions opt;
  opt.accumulation = accumulation;
  TrainCase c = gpt_case(opt);
  const double scale = factor ? data_parallel / *factor : 1.0;
  c.max_grad_norm = 1e9;  // the norm, compared every step, carries the scale: no clipping
  auto loss = c.loss;
  c.loss = [loss, scale](const std::shared_ptr<torch::nn::Module>& m, const at::Tensor& x,
                         const at::Tensor& y) {
    const at::Tensor value = loss(m, x, y);
    if (scale == 1.0) return value;
    return value.detach() + (value - value.detach()) * scale;
  };
  return c;
}

struct DivideCase {
  const char* name;
  int replicate;
  ReduceSettings settings;
};

class DivideSettings : public ::testing::TestWithParam<DivideCase> {};

TEST_P(DivideSettings, MatchSingleProcessWithScaledLoss) {
  const DivideCase d = GetParam();
  TrainCase reference_case = divide_case(4, d.settings.factor);
  const TrainRecord reference = train_reference(reference_case);
  TrainCase sharded = divide_case(4, std::nullopt);
  sharded.replicate = d.replicate;
  auto shard = sharded.shard;
  const ReduceSettings s = d.settings;
  sharded.shard = [shard, s](const std::shared_ptr<torch::nn::Module>& m, const DeviceMesh& mesh) {
    shard(m, mesh);
    apply_reduce_settings(s, m);
  };
  auto ranks = train_sharded(sharded, 4);
  expect_equivalent(reference, ranks, 1e-5, 1e-5);
}

const DivideCase kDivideCases[] = {
    {"default_fsdp", 1, {}},
    {"force_sum_fsdp", 1, {std::nullopt, true}},
    {"factor3_fsdp", 1, {3.0, false}},
    {"factor4_is_shard_size", 1, {4.0, false}},
    {"factor3_force_sum_fsdp", 1, {3.0, true}},
    {"default_hsdp", 2, {}},
    {"force_sum_hsdp", 2, {std::nullopt, true}},
    {"factor3_hsdp", 2, {3.0, false}},
    {"factor2_is_shard_size_hsdp", 2, {2.0, false}},
    {"factor8_force_sum_hsdp", 2, {8.0, true}},
    {"factor3_ddp", 4, {3.0, false}},
};
INSTANTIATE_TEST_SUITE_P(W4, DivideSettings, ::testing::ValuesIn(kDivideCases),
                         [](const auto& info) { return std::string(info.param.name); });

// Inter-tensor ZeRO-3 (each gradient reduced, summed, to its owner) divides by the factor too.
TEST(DivideFactor, WholeTensorPlacementDividesByIt) {
  const TrainRecord reference = train_reference(divide_case(2, 3.0));
  TrainCase c = divide_case(2, std::nullopt);
  c.shard = [](const std::shared_ptr<torch::nn::Module>& m, const DeviceMesh& mesh) {
    auto model = std::static_pointer_cast<models::GPT2LMHeadImpl>(m);
    std::vector<std::shared_ptr<torch::nn::Module>> units;
    for (auto& block : model->transformer->blocks) units.push_back(block.ptr());
    whole_tensor_shard(m, units, mesh);
    apply_reduce_settings({3.0, false}, m);
  };
  c.make_model = [make = c.make_model](const DeviceMesh*) { return make(nullptr); };  // built whole
  for (const TrainRecord& rank : train_sharded(c, 2)) {
    for (size_t s = 0; s < reference.losses.size(); ++s) {
      EXPECT_NEAR(rank.losses[s], reference.losses[s], 1e-5 * reference.losses[s]) << s;
      EXPECT_NEAR(rank.grad_norms[s], reference.grad_norms[s], 1e-5 * reference.grad_norms[s]) << s;
    }
  }
}

// Force-sum changes where the division happens, not the result: equal to the default within
// float rounding, step by step.
TEST(ForceSumReduction, EqualsTheDefaultWithinRounding) {
  for (const int replicate : {1, 2}) {
    TrainCase c = gpt_case();
    c.replicate = replicate;
    const auto defaults = train_sharded(c, 4);
    auto shard = c.shard;
    c.shard = [shard](const std::shared_ptr<torch::nn::Module>& m, const DeviceMesh& mesh) {
      shard(m, mesh);
      apply_reduce_settings({std::nullopt, true}, m);
    };
    const auto forced = train_sharded(c, 4);
    for (int r = 0; r < 4; ++r) {
      for (size_t s = 0; s < defaults[r].losses.size(); ++s) {
        EXPECT_NEAR(forced[r].grad_norms[s], defaults[r].grad_norms[s],
                    1e-6 * defaults[r].grad_norms[s]);
      }
      for (const auto& [name, p] : defaults[r].params) {
        EXPECT_LE((forced[r].params.at(name) - p).abs().max().item<double>(), 1e-6) << name;
      }
    }
  }
}

// --- set_requires_all_reduce: HSDP accumulation that all-reduces once per step ---

// With a divide factor too (the partial sums carry its pre-scaling).
TEST(RequiresAllReduce, AccumulationEqualsTheReference) {
  constexpr int kMicro = 3;
  for (const int replicate : {2, 4}) {  // HSDP 2 x 2, and replicas only (DDP-style)
    for (const std::optional<double> factor : {std::optional<double>(), std::optional(3.0)}) {
      TrainCase c = divide_case(4, std::nullopt, kMicro);
      c.replicate = replicate;
      c.before_micro_batch = [factor](const std::shared_ptr<torch::nn::Module>& m, int micro) {
        fsdp_module_of(*m)->set_requires_all_reduce(micro == kMicro - 1);
        if (factor && micro == 0) {
          for (FSDPModule unit : fsdp_modules_under(*m)) unit.set_gradient_divide_factor(*factor);
        }
      };
      const int units = 3;
      const auto ranks = train_sharded(
          c, 4, [&](int, const std::shared_ptr<torch::nn::Module>& m, const DeviceMesh& mesh) {
            // One all-reduce per unit per step (plus nothing else on the replicate group), a
            // reduce-scatter per unit per micro-batch where there is a shard dimension.
            const CommCounters across = mesh.replicate_group()->counters();
            const CommCounters within = mesh.shard_group().counters();
            mesh.reset_counters();
            EXPECT_EQ(across.all_reduce.calls, units) << "replicate " << replicate;
            EXPECT_EQ(within.reduce_scatter.calls, replicate == 4 ? 0 : kMicro * units)
                << "replicate " << replicate;
            EXPECT_EQ(stats_of(*m).live().comm_buffer_bytes, 0) << "a partial sum was left over";
          });
      expect_equivalent(train_reference(divide_case(4, factor, kMicro)), ranks, 1e-5, 1e-5);
    }
  }
}

// Between the micro-batches the parameters hold no gradient of this step (the partial sums are
// the unit's), as in FSDP2.
TEST(RequiresAllReduce, NoGradientUntilTheAllReduce) {
  run_ranks_in_threads(4, [](std::shared_ptr<ProcessGroup> group) {
    const DeviceMesh mesh = DeviceMesh::hybrid(group, 2);
    const TrainCase c = gpt_case();
    auto model = c.make_model(&mesh);
    c.shard(model, mesh);
    FSDPModule root = *fsdp_module_of(*model);
    auto [x, y] = c.batch(0);
    const int rank = group->rank();
    root.set_requires_all_reduce(false);
    c.loss(model, x.narrow(0, 3 * rank, 3), y.narrow(0, 3 * rank, 3)).backward();
    for (const auto& p : unique_parameters(*model)) EXPECT_FALSE(p.grad().defined());
    root.set_requires_all_reduce(true);
    c.loss(model, x.narrow(0, 3 * rank, 3), y.narrow(0, 3 * rank, 3)).backward();
    for (const auto& p : unique_parameters(*model)) EXPECT_TRUE(p.grad().defined());
  });
}

// --- set_all_reduce_hook: FSDP over the shard dimension plus a hand-made replica average ---

TEST(AllReduceHook, HandMadeHsdpEqualsHsdp) {
  TrainCase hsdp = gpt_case(GptCaseOptions{std::nullopt, 1, /*deferred=*/false});
  hsdp.replicate = 2;
  const auto native = train_sharded(hsdp, 4);
  TrainCase by_hand = hsdp;
  auto calls = std::make_shared<std::atomic<int>>(0);
  by_hand.shard = [calls](const std::shared_ptr<torch::nn::Module>& m, const DeviceMesh& mesh) {
    // A 1-D mesh over the shard group: FSDP alone; the hook averages across the replicas.
    const DeviceMesh shard_only(mesh.shard_group_ptr());
    ProcessGroup* replicas = mesh.replicate_group();
    auto model = std::static_pointer_cast<models::GPT2LMHeadImpl>(m);
    std::vector<FSDPModule> units;
    for (auto& block : model->transformer->blocks) units.push_back(fully_shard(block, shard_only));
    units.push_back(fully_shard(m, shard_only));
    for (FSDPModule& unit : units) {
      unit.set_all_reduce_hook([replicas, calls](at::Tensor& reduced) {
        replicas->all_reduce(reduced, ReduceOp::kAvg)->wait();
        ++*calls;
      });
    }
  };
  const auto hooked = train_sharded(by_hand, 4);
  EXPECT_EQ(calls->load(), 4 * 3 * static_cast<int>(hsdp.steps));  // ranks x units x steps
  for (int r = 0; r < 4; ++r) expect_bit_identical(native[r], hooked[r]);
}

// With one rank (no collective at all) the hook still sees the unit's gradients, packed.
TEST(AllReduceHook, RunsWithOneRankAndSeesThePackedGradients) {
  run_ranks_in_threads(1, [](std::shared_ptr<ProcessGroup> group) {
    const DeviceMesh mesh(group);
    torch::nn::Linear linear(4, 3);
    FSDPModule unit = fully_shard(linear, mesh);
    int64_t seen = 0;
    unit.set_all_reduce_hook([&](at::Tensor& t) {
      seen = t.numel();
      t.mul_(2);
    });
    const at::Tensor x = seeded_uniform({5, 4}, 3);
    fsdp::forward(linear, x).sum().backward();
    EXPECT_EQ(seen, 4 * 3 + 3);
    // d(sum)/d(bias) is the batch size; the hook doubled it.
    EXPECT_TRUE(at::allclose(linear->bias.grad(), at::full({3}, 10.0)));
  });
}

// --- set_unshard_in_backward: an embedding unit whose backward needs no weights ---

struct EmbedHeadImpl : torch::nn::Module {
  // The same values on every construction, from generators of their own (ranks are threads,
  // which must not share the global one).
  EmbedHeadImpl() {
    embed = register_module("embed", torch::nn::Embedding(32, 16));
    head = register_module("head", torch::nn::Linear(16, 32));
    at::NoGradGuard no_grad;
    uint64_t seed = 5;
    for (auto& p : parameters()) p.copy_(seeded_uniform(p.sizes(), seed++, 0.5));
  }
  at::Tensor forward(const at::Tensor& idx) {
    return fsdp::forward(head, fsdp::forward(embed, idx).relu());
  }
  torch::nn::Embedding embed{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(EmbedHead);

TrainCase embed_head_case(std::function<void(EmbedHeadImpl&, const DeviceMesh&)> shard) {
  TrainCase c;
  c.make_model = [](const DeviceMesh*) { return EmbedHead().ptr(); };
  c.shard = [shard](const std::shared_ptr<torch::nn::Module>& m, const DeviceMesh& mesh) {
    shard(static_cast<EmbedHeadImpl&>(*m), mesh);
    fully_shard(m, mesh);  // the root (no parameters of its own)
  };
  c.loss = [](const std::shared_ptr<torch::nn::Module>& m, const at::Tensor& x,
              const at::Tensor& y) {
    EmbedHead model(std::static_pointer_cast<EmbedHeadImpl>(m));
    at::Tensor logits = fsdp::forward(model, x);
    return torch::nn::functional::cross_entropy(logits.reshape({-1, 32}), y.reshape({-1}));
  };
  c.batch = [](int64_t step) {
    const at::Tensor tokens =
        seeded_uniform({8, 6}, 100 + step, 16).add(16).floor().clamp(0, 31).to(at::kLong);
    return std::make_pair(tokens, tokens.roll(1, 1));
  };
  c.lr = 1e-2;
  return c;
}

TEST(UnshardInBackward, EmbeddingUnitSkipsTheBackwardGather) {
  TrainCase c = embed_head_case([](EmbedHeadImpl& m, const DeviceMesh& mesh) {
    fully_shard(m.embed, mesh).set_unshard_in_backward(false);
    fully_shard(m.head, mesh);
  });
  const auto ranks = train_sharded(
      c, 2, [](int, const std::shared_ptr<torch::nn::Module>& m, const DeviceMesh& mesh) {
        // Per step: the embedding once (forward only), the head twice.
        EXPECT_EQ(mesh.shard_group().counters().all_gather.calls, 3);
        mesh.reset_counters();
        (void)m;
      });
  expect_equivalent(train_reference(c), ranks, 1e-5, 1e-5);
}

TEST(UnshardInBackward, AUnitWhoseBackwardReadsItsWeightsThrows) {
  run_ranks_in_threads(2, [](std::shared_ptr<ProcessGroup> group) {
    const DeviceMesh mesh(group);
    EmbedHead model;
    fully_shard(model->embed, mesh);
    fully_shard(model->head, mesh).set_unshard_in_backward(false);
    fully_shard(model.ptr(), mesh);
    const at::Tensor idx = at::arange(6).reshape({2, 3});
    at::Tensor loss = fsdp::forward(model, idx).sum();
    EXPECT_THAT(error_message([&] { loss.backward(); }),
                AllOf(HasSubstr("set_unshard_in_backward(false)"), HasSubstr("'weight'"),
                      HasSubstr("autograd saved it")));
  });
}

// --- ignored_params ---

TEST(IgnoredParams, StayWholeUnreducedAndSaved) {
  const std::string file = temp_path("ignored_params.safetensors");
  const std::string dir = temp_path("ignored_params_checkpoint");
  run_ranks_in_threads(2, [&](std::shared_ptr<ProcessGroup> group) {
    const DeviceMesh mesh(group);
    EmbedHead model;
    EmbedHead reference;  // same seed: the same initial values
    const at::Tensor bias = model->head->bias;
    fully_shard(model->embed, mesh);
    FSDPModule head =
        fully_shard(model->head, mesh, FullyShardOptions().ignored_params({model->head->bias}));
    fully_shard(model.ptr(), mesh);  // the root does not claim it either
    for (const FSDPModule& unit : fsdp_modules_under(*model)) {
      for (const auto& p : unit.sharded_parameters()) EXPECT_NE(p.name, "bias") << unit.path();
    }
    EXPECT_TRUE(model->head->bias.is_same(bias));
    EXPECT_EQ(model->head->bias.sizes(), c10::IntArrayRef({32}));

    // Each rank's gradient of the ignored bias is its own micro-batch's, not averaged.
    const int rank = group->rank();
    const at::Tensor idx = at::arange(12).remainder(32).reshape({4, 3});
    const at::Tensor mine = idx.narrow(0, 2 * rank, 2);
    fsdp::forward(model, mine).square().mean().backward();
    reference->forward(mine).square().mean().backward();
    EXPECT_TRUE(at::allclose(model->head->bias.grad(), reference->head->bias.grad(), 1e-6, 1e-7));

    // clip_grad_norm_ refuses it; without it, it works.
    EXPECT_THAT(error_message([&] { clip_grad_norm_(unique_parameters(*model), 1.0, mesh); }),
                HasSubstr("ignored_params"));
    // A checkpoint export saves it whole, and a sharded checkpoint restores it.
    checkpoint::save_full(file, *model, group.get());
    checkpoint::save_sharded(dir, *model, nullptr, group.get());
    EmbedHead fresh;
    {
      at::NoGradGuard no_grad;
      fresh->head->bias.zero_();
    }
    fully_shard(fresh->embed, mesh);
    fully_shard(fresh->head, mesh, FullyShardOptions().ignored_params({fresh->head->bias}));
    fully_shard(fresh.ptr(), mesh);
    checkpoint::load_sharded(dir, *fresh, nullptr, group.get());
    EXPECT_TRUE(at::equal(fresh->head->bias, model->head->bias));
  });
  remove_all(dir);
  const auto saved = checkpoint::load_safetensors(file);
  EmbedHead reference;
  ASSERT_TRUE(saved.count("head.bias"));
  EXPECT_TRUE(at::equal(saved.at("head.bias"), reference->head->bias));
  EXPECT_TRUE(at::equal(saved.at("head.weight"), reference->head->weight));
  std::remove(file.c_str());
}

// --- errors ---

TEST(Fsdp2OptionErrors, IgnoredParamNotInTheModule) {
  run_ranks_in_threads(1, [](std::shared_ptr<ProcessGroup> group) {
    const DeviceMesh mesh(group);
    torch::nn::Linear a(4, 3), b(4, 3);
    EXPECT_THAT(error_message(
                    [&] { fully_shard(a, mesh, FullyShardOptions().ignored_params({b->weight})); }),
                AllOf(HasSubstr("ignored_params[0]"), HasSubstr("[3, 4]"),
                      HasSubstr("is not a parameter of module")));
    EXPECT_THAT(error_message([&] {
                  fully_shard(a, mesh, FullyShardOptions().ignored_params({at::Tensor()}));
                }),
                HasSubstr("undefined"));
  });
}

TEST(Fsdp2OptionErrors, BadDivideFactor) {
  run_ranks_in_threads(1, [](std::shared_ptr<ProcessGroup> group) {
    const DeviceMesh mesh(group);
    torch::nn::Linear linear(4, 3);
    FSDPModule unit = fully_shard(linear, mesh);
    for (const double bad : {0.0, -2.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
      EXPECT_THAT(error_message([&] { unit.set_gradient_divide_factor(bad); }),
                  AllOf(HasSubstr("set_gradient_divide_factor("), HasSubstr("finite and > 0")))
          << bad;
    }
  });
}

TEST(Fsdp2OptionErrors, SettingsDuringBackward) {
  const std::vector<std::pair<const char*, std::function<void(FSDPModule&)>>> setters = {
      {"set_unshard_in_backward(false)", [](FSDPModule& m) { m.set_unshard_in_backward(false); }},
      {"set_requires_all_reduce(false)", [](FSDPModule& m) { m.set_requires_all_reduce(false); }},
      {"set_gradient_divide_factor", [](FSDPModule& m) { m.set_gradient_divide_factor(2); }},
      {"set_force_sum_reduction_for_comms(true)",
       [](FSDPModule& m) { m.set_force_sum_reduction_for_comms(true); }},
      {"set_all_reduce_hook", [](FSDPModule& m) { m.set_all_reduce_hook(nullptr); }},
  };
  for (const auto& [name, set] : setters) {
    run_ranks_in_threads(2, [&, name = name, set = set](std::shared_ptr<ProcessGroup> group) {
      const DeviceMesh mesh(group);
      TrainCase c = gpt_case();
      auto model = c.make_model(&mesh);
      c.shard(model, mesh);
      FSDPModule root = *fsdp_module_of(*model);
      auto [x, y] = c.batch(0);
      at::Tensor loss =
          c.loss(model, x.narrow(0, 6 * group->rank(), 6), y.narrow(0, 6 * group->rank(), 6));
      loss.register_hook([root, set](const at::Tensor&) {
        FSDPModule unit(root);
        set(unit);
      });
      EXPECT_THAT(error_message([&] { loss.backward(); }),
                  AllOf(HasSubstr(name), HasSubstr("while a backward pass is running")));
    });
  }
}

TEST(Fsdp2OptionErrors, HookThatChangesTheShape) {
  run_ranks_in_threads(2, [](std::shared_ptr<ProcessGroup> group) {
    const DeviceMesh mesh(group);
    torch::nn::Linear linear(4, 3);
    FSDPModule unit = fully_shard(linear, mesh);
    unit.set_all_reduce_hook([](at::Tensor& t) { t = t.narrow(0, 0, 1).clone(); });
    EXPECT_THAT(error_message([&] {
                  fsdp::forward(linear, at::ones({2, 4})).sum().backward();
                }),
                AllOf(HasSubstr("all-reduce hook"), HasSubstr("modify it in place")));
  });
}

}  // namespace
}  // namespace fsdp::test
