// The model and training-mode flags that the programs predicting a run share (fsdp-estimate,
// fsdp-plan), with fsdp-train's names and meanings, so that a prediction takes the command line
// of the run it predicts. Every value is checked while parsing or in estimate_options(), and
// the errors name the flags.
#pragma once

#include <common/cli_checks.h>
#include <fsdp/memory_estimate.h>
#include <models/model.h>

#include <c10/util/Exception.h>
#include <CLI/CLI.hpp>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace fsdp::tools {

inline at::ScalarType parse_dtype(const std::string& flag, const std::string& name) {
  if (name == "fp32") return at::kFloat;
  if (name == "bf16") return at::kBFloat16;
  if (name == "fp16") return at::kHalf;
  if (name == "fp64") return at::kDouble;
  TORCH_CHECK(false, flag, " must be fp32, bf16, fp16 or fp64, got '", name, "'");
}

// --model: a registered model name, or a Hugging Face model directory (one holding config.json;
// models::resolve_model_spec reads either).
inline CLI::Validator model_name_or_dir() {
  return CLI::Validator(
      [](std::string& value) -> std::string {
        for (const auto& name : fsdp::models::model_names()) {
          if (name == value) return "";
        }
        if (fsdp::models::is_pretrained_dir(value)) return "";
        return value + " not in {" + fsdp::models::model_names_joined() +
               "} and not a directory holding a Hugging Face config.json";
      },
      "NAME|DIR");
}

inline std::string model_flag_help(const std::string& what) {
  return what + ": " + fsdp::models::model_names_joined() +
         ", or a Hugging Face model directory (its config.json names one of " +
         "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
         "GPT2LMHeadModel)";
}

// The command line, with each flag's default.
struct ModelFlags {
  std::string model = "tiny";
  int64_t vocab_size = 0, n_positions = 0, n_embd = 0, n_layer = 0, n_head = 0;
  int world = 2, replicate = 1, prefetch = 1, grad_accum = 1;
  std::string accum_mode = "sync";
  std::string strategy = "full_shard", param_dtype, reduce_dtype, master_dtype = "fp32";
  double evenness_priority = 1.0;
  int64_t shard_dim = 0;
  int64_t global_batch = 16, seq_len = 64;
  bool activation_checkpoint = false, no_fsdp = false;
  int reshard_after_forward = 1;
};

inline void add_size_flags(CLI::App& app, ModelFlags& f) {
  app.add_option("--model", f.model, model_flag_help("Model config to start from"))
      ->check(model_name_or_dir())
      ->capture_default_str();
  const auto positive = integer_at_least(1);
  app.add_option("--vocab-size", f.vocab_size, "Override the config's vocab_size")->check(positive);
  app.add_option("--n-positions", f.n_positions,
                 "Override the config's longest sequence (GPT-2 n_positions, Llama "
                 "max_position_embeddings)")
      ->check(positive);
  app.add_option("--n-embd", f.n_embd,
                 "Override the config's width (GPT-2 n_embd, Llama hidden_size)")
      ->check(positive);
  app.add_option("--n-layer", f.n_layer, "Override the config's number of layers")->check(positive);
  app.add_option("--n-head", f.n_head, "Override the config's attention heads")->check(positive);
}

inline void add_mode_flags(CLI::App& app, ModelFlags& f) {
  app.add_option("--world-size,--nproc", f.world, "Ranks")
      ->check(integer_at_least(1))
      ->capture_default_str();
  app.add_option("--strategy", f.strategy,
                 "full_shard, shard_grad_op, no_shard, hybrid_shard or whole_tensor")
      ->check(CLI::IsMember(
          {"full_shard", "shard_grad_op", "no_shard", "hybrid_shard", "whole_tensor"}))
      ->capture_default_str();
  app.add_option("--evenness-priority", f.evenness_priority,
                 "whole_tensor: the partition's evenness priority, as fsdp-train's")
      ->check(finite_in(0, 1))
      ->capture_default_str();
  app.add_option("--shard-dim", f.shard_dim,
                 "Shard parameters with more than D dims along dim D, as fsdp-train's")
      ->check(integer_at_least(0))
      ->capture_default_str();
  app.add_option("--replicate", f.replicate, "Replicas for hybrid_shard (divides the world size)")
      ->check(integer_at_least(1))
      ->capture_default_str();
  app.add_option("--param-dtype", f.param_dtype,
                 "Mixed precision: dtype of unsharded parameters and compute (fp32, bf16, fp16)");
  app.add_option("--reduce-dtype", f.reduce_dtype,
                 "Mixed precision: dtype of gradient reduction (default: --param-dtype)");
  app.add_option("--master-dtype", f.master_dtype,
                 "dtype of sharded parameters, gradients and optimizer state")
      ->capture_default_str();
  app.add_option("--global-batch", f.global_batch, "Sequences per step over all ranks")
      ->check(integer_at_least(1))
      ->capture_default_str();
  app.add_option("--seq-len", f.seq_len, "Tokens per sequence")
      ->check(integer_at_least(1))
      ->capture_default_str();
  app.add_flag("--activation-checkpoint", f.activation_checkpoint,
               "Every block checkpoints its forward");
  app.add_option("--reshard-after-forward", f.reshard_after_forward,
                 "As fsdp-train's: 1 blocks reshard after forward, 0 they keep their parameters, "
                 "N >= 2 they keep a 1/N piece (hpZ)")
      ->check(integer_at_least(0))
      ->capture_default_str();
  app.add_option("--prefetch", f.prefetch, "Implicit prefetch depth (0: off)")
      ->check(integer_at_least(0))
      ->capture_default_str();
  app.add_option("--grad-accum", f.grad_accum,
                 "Forward/backward passes per step, each on 1/K of the rank's batch")
      ->check(integer_at_least(1))
      ->capture_default_str();
  app.add_option("--accum-mode", f.accum_mode,
                 "sync, no-sync, no-reshard or no-all-reduce (see fsdp-train)")
      ->check(CLI::IsMember({"sync", "no-sync", "no-reshard", "no-all-reduce"}))
      ->capture_default_str();
  app.add_flag("--no-fsdp", f.no_fsdp, "Plain single-process training (fsdp-train --no-fsdp)");
}

// The model's spec with the size flags applied; their errors name the flags.
inline std::shared_ptr<const fsdp::models::ModelSpec> sized_spec(const ModelFlags& f) {
  fsdp::models::SizeOverrides overrides;
  overrides.vocab_size = f.vocab_size;
  overrides.max_seq_len = f.n_positions;
  overrides.dim = f.n_embd;
  overrides.n_layers = f.n_layer;
  overrides.n_heads = f.n_head;
  // A directory's config.json errors name the file, not these flags.
  const auto spec = fsdp::models::resolve_model_spec(f.model);
  try {
    return spec->with_overrides(overrides);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "--n-embd, --n-head, --n-layer, --vocab-size or --n-positions: ",
                e.what_without_backtrace());
  }
}

// The estimator's options, every flag that depends on another checked.
inline fsdp::MemoryEstimateOptions estimate_options(const ModelFlags& f) {
  fsdp::MemoryEstimateOptions options;
  options.world_size(f.world)
      .strategy(fsdp::parse_sharding_strategy(f.strategy))
      .replicate(f.replicate)
      .master_dtype(parse_dtype("--master-dtype", f.master_dtype))
      .prefetch(f.prefetch)
      .grad_accum(f.grad_accum)
      .accumulation(fsdp::parse_accumulation_mode(f.accum_mode))
      .evenness_priority(f.evenness_priority)
      .shard_dim(f.shard_dim)
      .reshard_after_forward_size(f.reshard_after_forward == 0   ? 1
                                  : f.reshard_after_forward == 1 ? 0
                                                                 : f.reshard_after_forward)
      .fsdp(!f.no_fsdp);
  TORCH_CHECK(options.strategy() == fsdp::ShardingStrategy::kHybridShard || f.replicate == 1,
              "--replicate ", f.replicate, " needs --strategy hybrid_shard");
  TORCH_CHECK(f.evenness_priority == 1 || f.strategy == "whole_tensor", "--evenness-priority ",
              f.evenness_priority, " applies to --strategy whole_tensor only, not ", f.strategy);
  TORCH_CHECK(f.shard_dim == 0 || f.strategy != "whole_tensor", "--shard-dim ", f.shard_dim,
              " splits tensors along a dim, but --strategy whole_tensor keeps each tensor whole");
  TORCH_CHECK(f.world % f.replicate == 0, "--replicate ", f.replicate,
              " does not divide --world-size ", f.world);
  const int shard_group = f.strategy == "hybrid_shard" ? f.world / f.replicate
                          : f.strategy == "no_shard"   ? 1
                                                       : f.world;
  TORCH_CHECK(f.reshard_after_forward <= 1 || shard_group % f.reshard_after_forward == 0,
              "--reshard-after-forward ", f.reshard_after_forward,
              " (a group size) does not divide the shard group of ", shard_group, " ranks");
  if (!f.param_dtype.empty()) options.param_dtype(parse_dtype("--param-dtype", f.param_dtype));
  if (!f.reduce_dtype.empty()) options.reduce_dtype(parse_dtype("--reduce-dtype", f.reduce_dtype));
  return options;
}

// Checks the batch against the world size and the model; returns one pass's sequences per rank.
inline int64_t checked_micro_batch(ModelFlags& f, const fsdp::models::ModelSpec& spec) {
  TORCH_CHECK(f.seq_len <= spec.max_seq_len(), "--seq-len ", f.seq_len, " is outside [1, ",
              spec.max_seq_len(), "], the positions model '", f.model, "' has");
  if (f.no_fsdp) f.world = 1;
  TORCH_CHECK(f.world >= 1, "--world-size must be at least 1, got ", f.world);
  TORCH_CHECK(f.grad_accum >= 1, "--grad-accum must be at least 1, got ", f.grad_accum);
  TORCH_CHECK(f.global_batch >= 1 && f.global_batch % (int64_t(f.world) * f.grad_accum) == 0,
              "--global-batch ", f.global_batch,
              " is not a positive multiple of ranks x micro-batches = ", f.world, " x ",
              f.grad_accum);
  return f.global_batch / f.world / f.grad_accum;
}

// The model's memory description for one pass; its errors name the flags.
inline fsdp::ModelMemorySpec memory_spec_for(const ModelFlags& f,
                                             const fsdp::models::ModelSpec& spec,
                                             int64_t micro_batch, at::ScalarType compute,
                                             bool activation_checkpoint) {
  try {
    return spec.memory_spec(micro_batch, f.seq_len, compute, activation_checkpoint);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "--global-batch ", f.global_batch, " and --seq-len ", f.seq_len, " on ",
                f.world, " ranks of model '", f.model,
                "' (sizes from --n-embd, --n-layer, --vocab-size): ", e.what_without_backtrace());
  }
}

// The run's settings as printed under "settings".
inline nlohmann::json settings_json(const ModelFlags& f, const fsdp::models::ModelSpec& spec,
                                    int64_t micro_batch) {
  const std::string& param_dtype = f.param_dtype.empty() ? f.master_dtype : f.param_dtype;
  nlohmann::json settings = {
      {"model", f.model},
      {"parameters", spec.num_parameters()},
      {"world_size", f.world},
      {"strategy", f.no_fsdp ? std::string("none") : f.strategy},
      {"replicate", f.replicate},
      {"shard_dim", f.shard_dim},
      {"reshard_after_forward", f.reshard_after_forward},
      {"param_dtype", param_dtype},
      {"reduce_dtype", f.reduce_dtype.empty() ? param_dtype : f.reduce_dtype},
      {"global_batch", f.global_batch},
      {"micro_batch", micro_batch},
      {"seq_len", f.seq_len},
      {"activation_checkpoint", f.activation_checkpoint},
      {"prefetch", f.prefetch},
      {"grad_accum", f.grad_accum},
      {"accum_mode", f.accum_mode}};
  for (const auto& [key, value] : spec.sizes()) settings[key] = value;
  return settings;
}

}  // namespace fsdp::tools
