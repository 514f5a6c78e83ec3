// The model and training-mode settings that the programs predicting a run share (fsdp-estimate,
// fsdp-plan): fsdp-train's own flags (job_flags.h), with the same names, allowed values and TOML
// keys, so that a prediction takes the command line, or the --config file, of the run it
// predicts. Every value is checked while parsing or in estimate_options(), and the errors name
// the flags.
#pragma once

#include <common/cli_checks.h>
#include <common/config_flags.h>
#include <common/job_flags.h>
#include <fsdp/memory_estimate.h>
#include <fsdp/models/model.h>
#include <train/job_config.h>

#include <c10/util/Exception.h>
#include <CLI/CLI.hpp>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace fsdp::tools {

// The settings, each with fsdp-train's default.
struct ModelFlags {
  // [model], the batch of [training] (global batch, sequence length, accumulation) and the
  // sharding of [parallelism].
  train::JobConfig job;
  int world = 2;  // --nproc (alias --world-size): the ranks of the run predicted
  // The dtype of sharded parameters, gradients and optimizer state (fsdp-train's are fp32).
  at::ScalarType master_dtype = at::kFloat;
  bool param_dtype_given = false;  // without --param-dtype, compute is in the master dtype
};

// Defines them on flags; --config files of fsdp-train are read with the settings that do not
// change a prediction ([data], [checkpoint], ...) accepted and ignored.
void add_prediction_flags(ConfigFlags& flags, ModelFlags& f);

// The dtype the run computes in.
inline at::ScalarType compute_dtype(const ModelFlags& f) {
  if (f.job.parallelism.no_fsdp || !f.param_dtype_given) return f.master_dtype;
  return f.job.parallelism.param_dtype;
}

// The model's spec with the size flags applied; their errors name the flags.
inline std::shared_ptr<const fsdp::models::ModelSpec> sized_spec(const ModelFlags& f) {
  // A directory's config.json errors name the file, not these flags.
  const auto spec = fsdp::models::resolve_model_spec(f.job.model.name);
  try {
    return spec->with_overrides(train::size_overrides(f.job.model));
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "--n-embd, --n-head, --n-layer, --vocab-size or --n-positions: ",
                e.what_without_backtrace());
  }
}

// --sequence-parallel's own conditions, for fsdp-train's check_job and the predicting programs:
// --tp N > 1, and --seq-len divides by N.
inline void check_sequence_parallel(const train::ParallelismConfig& p, int64_t seq_len) {
  TORCH_CHECK(!p.sequence_parallel || p.tp > 1,
              "--sequence-parallel splits the sequence over the tensor-parallel ranks and needs "
              "--tp N > 1, got --tp ",
              p.tp);
  TORCH_CHECK(!p.sequence_parallel || seq_len % p.tp == 0,
              "--sequence-parallel splits each sequence over --tp ", p.tp, " ranks: --seq-len ",
              seq_len, " must divide by it");
}

// --head-unit's own conditions, for fsdp-train's check_job and the predicting programs: the
// head's unit and a lookup from its table's Shard(0) shards ([Note: the head as a unit]); the
// layouts that would place the table otherwise are refused by name.
inline void check_head_unit(const train::ParallelismConfig& p) {
  if (!p.head_unit) return;
  const auto refuse = [&](bool bad, const std::string& what) {
    TORCH_CHECK(!bad, "--head-unit makes the output head an FSDP unit over Shard(0) shards; ", what,
                " is not supported with it");
  };
  refuse(p.no_fsdp, "--no-fsdp (no units at all)");
  refuse(p.tp > 1, "--tp " + std::to_string(p.tp) + " (the head is split over the vocabulary)");
  refuse(p.strategy == ShardingStrategy::kWholeTensor, "--strategy whole_tensor");
  refuse(p.wrap_policy.min_params.has_value(), "--wrap-policy min-params (it picks the units)");
  refuse(p.shard_dim > 0, "--shard-dim " + std::to_string(p.shard_dim) +
                              " (a tied table is looked up by rows, its dim 0)");
  refuse(p.offload && p.device != train::DeviceKind::kCpu, "--offload with --device cuda");
}

// The ranks FSDP runs over: the data-parallel ones, W / --tp (fsdp-train's check_job refuses
// the --tp settings it does not run; a prediction of them is refused here).
inline int data_parallel_ranks(const ModelFlags& f) {
  const train::ParallelismConfig& p = f.job.parallelism;
  TORCH_CHECK(f.world % p.tp == 0, "--tp ", p.tp, " does not divide --world-size ", f.world);
  TORCH_CHECK(p.tp == 1 || (!p.no_fsdp && (p.strategy == ShardingStrategy::kFullShard ||
                                           p.strategy == ShardingStrategy::kShardGradOp)),
              "--tp ", p.tp, " runs with --strategy full_shard or shard_grad_op only, got ",
              p.no_fsdp ? std::string("--no-fsdp") : to_string(p.strategy));
  check_sequence_parallel(p, f.job.training.seq_len);
  return f.world / p.tp;
}

// The estimator's options, every flag that depends on another checked.
inline fsdp::MemoryEstimateOptions estimate_options(const ModelFlags& f) {
  const train::ParallelismConfig& p = f.job.parallelism;
  const train::TrainingConfig& t = f.job.training;
  fsdp::MemoryEstimateOptions options;
  options.world_size(data_parallel_ranks(f))
      .strategy(p.strategy)
      .replicate(p.replicate)
      .master_dtype(f.master_dtype)
      .prefetch(p.prefetch)
      .grad_accum(t.grad_accum)
      .accumulation(t.accum_mode)
      .evenness_priority(p.evenness_priority)
      .shard_dim(p.shard_dim)
      .reshard_after_forward_size(p.reshard_after_forward == 0   ? 1
                                  : p.reshard_after_forward == 1 ? 0
                                                                 : p.reshard_after_forward)
      .fsdp(!p.no_fsdp)
      .head_unit(p.head_unit);
  check_head_unit(p);
  const bool whole = p.strategy == ShardingStrategy::kWholeTensor;
  TORCH_CHECK(p.strategy == ShardingStrategy::kHybridShard || p.replicate == 1, "--replicate ",
              p.replicate, " needs --strategy hybrid_shard");
  TORCH_CHECK(p.evenness_priority == 1 || whole, "--evenness-priority ", p.evenness_priority,
              " applies to --strategy whole_tensor only, not ", p.strategy);
  TORCH_CHECK(p.shard_dim == 0 || !whole, "--shard-dim ", p.shard_dim,
              " splits tensors along a dim, but --strategy whole_tensor keeps each tensor whole");
  TORCH_CHECK(f.world % p.replicate == 0, "--replicate ", p.replicate,
              " does not divide --world-size ", f.world);
  const int shard_group = p.strategy == ShardingStrategy::kHybridShard ? f.world / p.replicate
                          : p.strategy == ShardingStrategy::kNoShard   ? 1
                                                                       : f.world;
  TORCH_CHECK(p.reshard_after_forward <= 1 || shard_group % p.reshard_after_forward == 0,
              "--reshard-after-forward ", p.reshard_after_forward,
              " (a group size) does not divide the shard group of ", shard_group, " ranks");
  if (f.param_dtype_given) options.param_dtype(p.param_dtype);
  if (p.reduce_dtype.has_value()) options.reduce_dtype(*p.reduce_dtype);
  return options;
}

// Checks the batch against the world size and the model; returns one pass's sequences per rank.
inline int64_t checked_micro_batch(ModelFlags& f, const fsdp::models::ModelSpec& spec) {
  const train::TrainingConfig& t = f.job.training;
  TORCH_CHECK(t.seq_len <= spec.max_seq_len(), "--seq-len ", t.seq_len, " is outside [1, ",
              spec.max_seq_len(), "], the positions model '", f.job.model.name, "' has");
  if (f.job.parallelism.no_fsdp) f.world = 1;
  TORCH_CHECK(f.world >= 1, "--world-size must be at least 1, got ", f.world);
  TORCH_CHECK(t.grad_accum >= 1, "--grad-accum must be at least 1, got ", t.grad_accum);
  const int data = data_parallel_ranks(f);
  TORCH_CHECK(t.global_batch >= 1 && t.global_batch % (int64_t(data) * t.grad_accum) == 0,
              "--global-batch ", t.global_batch,
              " is not a positive multiple of data-parallel ranks x micro-batches = ", data, " x ",
              t.grad_accum);
  return t.global_batch / data / t.grad_accum;
}

// The model's memory description for one pass; its errors name the flags.
inline fsdp::ModelMemorySpec memory_spec_for(const ModelFlags& f,
                                             const fsdp::models::ModelSpec& spec,
                                             int64_t micro_batch, at::ScalarType compute) {
  const train::TrainingConfig& t = f.job.training;
  try {
    return spec.memory_spec(micro_batch, t.seq_len, compute, f.job.model.activation_checkpoint,
                            f.job.parallelism.tp, f.job.parallelism.sequence_parallel);
  } catch (const c10::Error& e) {
    const int tp = f.job.parallelism.tp;
    TORCH_CHECK(false, "--global-batch ", t.global_batch, " and --seq-len ", t.seq_len, " on ",
                f.world, " ranks of model '", f.job.model.name,
                "' (sizes from --n-embd, --n-layer, --vocab-size",
                tp > 1 ? ", split by --tp " + std::to_string(tp) : std::string(),
                "): ", e.what_without_backtrace());
  }
}

// The run's settings as printed under "settings".
inline nlohmann::json settings_json(const ModelFlags& f, const fsdp::models::ModelSpec& spec,
                                    int64_t micro_batch) {
  const train::ParallelismConfig& p = f.job.parallelism;
  const train::TrainingConfig& t = f.job.training;
  const std::string param_dtype = train::dtype_name(compute_dtype(f));
  nlohmann::json settings = {
      {"model", f.job.model.name},
      {"parameters", spec.num_parameters()},
      {"world_size", f.world},
      {"strategy", p.no_fsdp ? std::string("none") : to_string(p.strategy)},
      {"replicate", p.replicate},
      {"shard_dim", p.shard_dim},
      {"reshard_after_forward", p.reshard_after_forward},
      {"param_dtype", param_dtype},
      {"reduce_dtype", p.reduce_dtype ? train::dtype_name(*p.reduce_dtype) : param_dtype},
      {"global_batch", t.global_batch},
      {"micro_batch", micro_batch},
      {"seq_len", t.seq_len},
      {"activation_checkpoint", f.job.model.activation_checkpoint},
      {"prefetch", p.prefetch},
      {"head_unit", p.head_unit},
      {"grad_accum", t.grad_accum},
      {"accum_mode", to_string(t.accum_mode)}};
  for (const auto& [key, value] : spec.sizes()) settings[key] = value;
  return settings;
}

}  // namespace fsdp::tools
