// The training comparison of tp_training.h: each model trained in one process and on a dp x tp
// mesh of threads, as the trainer composes them (each unit split and sharded as it is built, the
// root's plan, then the root sharded).
#include "tensor_parallel/tp_training.h"

#include "support/test_support.h"

#include <fsdp/fully_shard.h>
#include <fsdp/named_mesh.h>
#include <fsdp/tensor_parallel.h>
#include <models/common/modules.h>
#include <models/gpt2/gpt2.h>
#include <models/gpt2/gpt2_parallelize.h>
#include <models/llama/llama.h>
#include <models/llama/llama_parallelize.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::test {
namespace {

using models::LlamaConfig;
using models::LlamaForCausalLM;
using models::LlamaOptions;

struct TpRecord {
  TrainRecord train;
  // Per parameter name: its tensor-parallel placement (dim, or -1 if replicated; packed blocks).
  std::map<std::string, int64_t> tp_dim;
  std::map<std::string, int64_t> tp_packed;
  int tp_rank = 0;
  int tp_size = 1;
};

// llama-tiny (with q/k norms for kQwen3) or GPT-2 tiny, built whole (mesh null) or, on a 2-D mesh,
// with each block split over its tp dimension and sharded over its dp dimension as it is built, the
// root last.
std::shared_ptr<torch::nn::Module> build_model(Family family, const NamedMesh* mesh,
                                               bool activation_checkpoint, bool sequence_parallel) {
  std::optional<DeviceMesh> tp, dp;
  if (mesh != nullptr) tp = (*mesh)["tp"], dp = (*mesh)["dp"];
  const auto split_and_shard = [&](const TensorParallelPlan& plan) {
    return [&, plan](const std::string&, const std::shared_ptr<torch::nn::Module>& block) {
      parallelize_module(*block, *tp, plan);
      fully_shard(block, *dp);
    };
  };
  std::shared_ptr<torch::nn::Module> model;
  if (family != Family::kGpt2) {
    LlamaConfig config = LlamaConfig::tiny();
    config.qk_norm = family == Family::kQwen3;
    LlamaOptions o(config);
    o.seed(42).activation_checkpoint(activation_checkpoint);
    if (mesh) {
      o.on_layer_built(split_and_shard(
          models::llama_layer_tp_plan(o.config(), tp->shard_size(), sequence_parallel)));
    }
    model = LlamaForCausalLM(o).ptr();
    if (mesh) {
      parallelize_module(
          *model, *tp, models::llama_root_tp_plan(o.config(), tp->shard_size(), sequence_parallel));
    }
  } else {
    models::GPT2Options o(models::GPT2Config::tiny());
    o.seed(42).activation_checkpoint(activation_checkpoint);
    if (mesh) {
      o.on_block_built(split_and_shard(
          models::gpt2_block_tp_plan(o.config(), tp->shard_size(), sequence_parallel)));
    }
    model = models::GPT2LMHead(o).ptr();
    if (mesh) {
      parallelize_module(
          *model, *tp, models::gpt2_root_tp_plan(o.config(), tp->shard_size(), sequence_parallel));
    }
  }
  if (mesh) fully_shard(model, *dp);
  return model;
}

at::Tensor model_loss(Family family, const std::shared_ptr<torch::nn::Module>& m,
                      const at::Tensor& x, const at::Tensor& y) {
  if (family != Family::kGpt2) {
    LlamaForCausalLM model(std::static_pointer_cast<models::LlamaForCausalLMImpl>(m));
    return models::loss(fsdp::forward(model, x), y, *model->lm_head);
  }
  models::GPT2LMHead model(std::static_pointer_cast<models::GPT2LMHeadImpl>(m));
  return models::loss(fsdp::forward(model, x), y, model->head());
}

TrainCase tp_case(Family family) {
  TrainCase c;
  c.batch = [](int64_t step) { return text_batch(step, 8, 16, 7); };
  c.steps = 5;
  c.lr = 1e-3;
  c.make_model = [family](const DeviceMesh*) { return build_model(family, nullptr, false, false); };
  c.loss = [family](const std::shared_ptr<torch::nn::Module>& m, const at::Tensor& x,
                    const at::Tensor& y) { return model_loss(family, m, x, y); };
  return c;
}

void record_params(const torch::nn::Module& model, TpRecord& out) {
  for (const auto& unit : fsdp_modules_under(model)) {
    for (const auto& sp : unit.sharded_parameters()) {
      const std::string name = unit.path().empty() ? sp.name : unit.path() + "." + sp.name;
      out.train.params[name] = sp.local.detach().clone();
      out.train.metadata[name] = sp.metadata;
      const TensorParallelPlacement* placement = tensor_parallel_placement(sp.local);
      out.tp_dim[name] = placement ? placement->dim : -1;
      out.tp_packed[name] = placement ? placement->packed : 1;
    }
  }
}

std::vector<TpRecord> train_2d(const TpRun& run, const TrainCase& c) {
  const int dp = run.dp, tp = run.tp;
  std::vector<TpRecord> records(dp * tp);
  run_ranks_in_threads(dp * tp, [&](std::shared_ptr<ProcessGroup> world) {
    const NamedMesh mesh(world, {{"dp", dp}, {"tp", tp}});
    TpRecord& record = records[world->rank()];
    record.tp_rank = mesh.coordinate("tp");
    record.tp_size = tp;
    auto model = build_model(run.family, &mesh, run.activation_checkpoint, run.sequence_parallel);
    auto params = unique_parameters(*model);
    torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(c.lr).weight_decay(0.1));
    const int64_t rows = 8 / dp, first = mesh.coordinate("dp") * rows;
    for (int64_t step = 0; step < c.steps; ++step) {
      optimizer.zero_grad();
      auto [inputs, targets] = c.batch(step);
      at::Tensor loss =
          c.loss(model, inputs.narrow(0, first, rows), targets.narrow(0, first, rows));
      loss.backward();
      at::Tensor summed = loss.detach().clone().reshape({1});
      mesh.group("dp")->all_reduce(summed, ReduceOp::kSum)->wait();
      record.train.grad_norms.push_back(clip_grad_norm_(params, c.max_grad_norm, mesh["dp"]));
      record.train.losses.push_back(summed.item<double>() / dp);
      optimizer.step();
    }
    record_params(*model, record);
  });
  return records;
}

// The reference's value of a rank's parameter: its tensor-parallel slice, then FSDP's rows.
// full's slice on tensor-parallel rank `rank` of `size` along dim, of each of packed blocks,
// computed here independently of fsdp::tensor_parallel_slice_view (a reference for it).
at::Tensor tp_slice(const at::Tensor& full, int64_t dim, int64_t packed, int rank, int size) {
  std::vector<int64_t> blocks = full.sizes().vec(), local = full.sizes().vec();
  blocks[dim] /= packed;
  blocks.insert(blocks.begin() + dim, packed);
  local[dim] /= size;
  const int64_t part = blocks[dim + 1] / size;
  return full.reshape(blocks).narrow(dim + 1, rank * part, part).reshape(local);
}

void expect_params_match(const TrainRecord& reference, const TpRecord& got, int expected_split,
                         double tol) {
  int split = 0;
  for (const auto& [name, dim] : got.tp_dim) split += dim >= 0 ? 1 : 0;
  EXPECT_EQ(split, expected_split) << "parameters split by tensor parallelism";
  for (const auto& [name, shard] : got.train.params) {
    const ShardMetadata& m = got.train.metadata.at(name);
    at::Tensor full = reference.params.at(name);
    if (const int64_t d = got.tp_dim.at(name); d >= 0) {
      full = tp_slice(full, d, got.tp_packed.at(name), got.tp_rank, got.tp_size);
    }
    ASSERT_EQ(full.sizes().vec(), m.global_shape) << name;
    if (m.local_rows == 0) continue;
    std::vector<int64_t> padded = full.sizes().vec();
    padded[0] = m.padded_rows;
    const at::Tensor mine = shard.reshape(padded).narrow(0, 0, m.local_rows);
    const double diff =
        (mine - full.narrow(0, m.local_offset, m.local_rows)).abs().max().item<double>();
    EXPECT_LE(diff, tol) << name << " on tp rank " << got.tp_rank;
  }
}

}  // namespace

void expect_matches_reference(const TpRun& run) {
  const Family family = run.family;
  const TrainCase c = tp_case(family);
  const TrainRecord reference = train_reference(c);
  EXPECT_LT(reference.losses.back(), reference.losses.front() - 0.05);  // it learns
  const auto ranks = train_2d(run, c);
  // 2 blocks: Llama's q, k, v, o, gate, up, down; GPT-2's c_attn and c_fc weights and biases
  // and both c_proj weights (their biases are replicated). The root: Llama's embedding and
  // head, GPT-2's wte (tied to the head), split over the vocabulary.
  const int expected_split = family == Family::kGpt2 ? 13 : 16;
  for (size_t r = 0; r < ranks.size(); ++r) {
    for (size_t s = 0; s < reference.losses.size(); ++s) {
      EXPECT_NEAR(ranks[r].train.losses[s], reference.losses[s], 1e-5 * reference.losses[s])
          << "loss, rank " << r << " step " << s;
      EXPECT_NEAR(ranks[r].train.grad_norms[s], reference.grad_norms[s],
                  1e-5 * reference.grad_norms[s])
          << "grad norm, rank " << r << " step " << s;
    }
    expect_params_match(reference, ranks[r], expected_split, 1e-5);
  }
}

std::string error_when_rank_1_is_gone(
    const std::function<void(const std::shared_ptr<ProcessGroup>&)>& forward) {
  ProcessGroupOptions options;
  options.timeout = std::chrono::milliseconds(1500);
  try {
    run_ranks_in_threads(
        2,
        [&](std::shared_ptr<ProcessGroup> group) {
          if (group->rank() == 0) forward(group);
        },
        options);
  } catch (const c10::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace fsdp::test
