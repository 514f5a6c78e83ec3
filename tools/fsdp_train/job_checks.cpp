// The checks of a job's settings against each other, the world size, the model and the data:
// what no single flag's validator can see (job_flags.h checks each value alone). Every message
// names the flags and their values.
#include <common/model_flags.h>
#include <fsdp/data/tokenizer.h>
#include <fsdp/models/model.h>
#include <fsdp_train/job_checks.h>
#include <fsdp_train/sources.h>

#include <ATen/Context.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <limits>
#include <string>
#include <utility>

namespace fsdp::train {
namespace {

// The byte-level data feeds token ids 0..255.
constexpr int64_t kByteVocab = 256;

// --tp N: the data-parallel ranks (W / N) are what the global batch is split over. The settings
// tensor parallelism is not built for yet are refused by name rather than run untested.
void check_tensor_parallel(const JobConfig& o, int world) {
  const ParallelismConfig& p = o.parallelism;
  TORCH_CHECK(p.tp >= 1 && world % p.tp == 0, "--tp ", p.tp, " does not divide the world size ",
              world);
  tools::check_sequence_parallel(p, o.training.seq_len);
  if (p.tp == 1) return;
  const auto refuse = [&](bool bad, const std::string& what) {
    TORCH_CHECK(!bad, "--tp ", p.tp, ": ", what, " is not supported with tensor parallelism yet");
  };
  refuse(p.no_fsdp, "--no-fsdp");
  refuse(p.strategy != ShardingStrategy::kFullShard && p.strategy != ShardingStrategy::kShardGradOp,
         "--strategy " + std::string(to_string(p.strategy)));
  refuse(p.wrap_policy.min_params.has_value(), "--wrap-policy min-params");
  refuse(p.offload, "--offload");
  refuse(p.device != DeviceKind::kCpu, "--device cuda");
  refuse(o.checkpoint.format == checkpoint::CheckpointFormat::kDcpHf,
         "--checkpoint-format dcp-hf (a row layer's columns are no DCP chunk of ours)");
}

void check_batch(const TrainingConfig& t, int world) {
  // --steps 0 trains nothing: with --export it writes the initial weights.
  TORCH_CHECK(t.steps >= 0, "--steps must be non-negative, got ", t.steps);
  TORCH_CHECK(t.global_batch >= 1, "--global-batch must be at least 1, got ", t.global_batch);
  TORCH_CHECK(t.global_batch % world == 0, "--global-batch ", t.global_batch,
              " is not divisible by the number of data-parallel ranks, ", world,
              ": every rank trains on an equal slice of the global batch");
  TORCH_CHECK(t.lr > 0, "--lr must be positive, got ", t.lr);
  TORCH_CHECK(t.grad_accum >= 1, "--grad-accum must be at least 1, got ", t.grad_accum);
  TORCH_CHECK(t.global_batch % (int64_t(world) * t.grad_accum) == 0, "--global-batch ",
              t.global_batch, " is not divisible by ranks x --grad-accum micro-batches = ", world,
              " x ", t.grad_accum);
}

void check_schedule_and_val(const JobConfig& o) {
  const TrainingConfig& t = o.training;
  TORCH_CHECK(t.warmup_steps >= 0, "--warmup-steps must be non-negative, got ", t.warmup_steps);
  TORCH_CHECK(t.min_lr >= 0 && t.min_lr <= t.lr, "--min-lr ", t.min_lr, " must be in [0, --lr ",
              t.lr, "]");
  TORCH_CHECK(t.decay_frac >= 0 && t.decay_frac <= 1, "--decay-frac must be in [0, 1], got ",
              t.decay_frac);
  TORCH_CHECK(o.data.val_every >= 0, "--val-every must be non-negative, got ", o.data.val_every);
  TORCH_CHECK(o.data.val_batches >= 1, "--val-batches must be at least 1, got ",
              o.data.val_batches);
  TORCH_CHECK(o.metrics.log_every >= 1, "--log-every must be at least 1, got ",
              o.metrics.log_every);
}

// --all-gather int8 quantizes the all-gathers of parameters: there must be some.
void check_all_gather(const ParallelismConfig& p, int shard_group) {
  if (!p.all_gather.int8_block.has_value()) return;
  TORCH_CHECK(!p.no_fsdp, "--all-gather ", p.all_gather,
              " quantizes FSDP's all-gather of parameters; --no-fsdp has none");
  TORCH_CHECK(p.strategy != ShardingStrategy::kWholeTensor, "--all-gather ", p.all_gather,
              " quantizes the all-gather of Shard(0) placement; --strategy whole_tensor "
              "broadcasts whole tensors instead");
  const int gathering = p.strategy == ShardingStrategy::kNoShard ? 1 : shard_group;
  TORCH_CHECK(
      gathering > 1, "--all-gather ", p.all_gather,
      " quantizes the all-gather of parameters, but --strategy ", p.strategy, " on ",
      p.strategy == ShardingStrategy::kHybridShard ? shard_group * p.replicate : shard_group,
      " rank(s) leaves a shard group of 1 rank, which gathers nothing");
}

// The settings that apply to some strategies only.
void check_strategy_settings(const ParallelismConfig& p, AccumulationMode accum_mode) {
  const bool replicated =
      p.strategy == ShardingStrategy::kHybridShard || p.strategy == ShardingStrategy::kNoShard;
  TORCH_CHECK(accum_mode != AccumulationMode::kNoAllReduce || replicated,
              "--accum-mode no-all-reduce skips the all-reduce across replicas, which only "
              "--strategy hybrid_shard and no_shard have, not ",
              p.strategy);
  TORCH_CHECK(p.gradient_divide_factor == 0 ||
                  (std::isfinite(p.gradient_divide_factor) && p.gradient_divide_factor > 0),
              "--gradient-divide-factor must be finite and > 0, got ", p.gradient_divide_factor);
  const bool whole = p.strategy == ShardingStrategy::kWholeTensor;
  TORCH_CHECK(p.evenness_priority >= 0 && p.evenness_priority <= 1,
              "--evenness-priority must be in [0, 1], got ", p.evenness_priority);
  TORCH_CHECK(p.evenness_priority == 1 || whole, "--evenness-priority ", p.evenness_priority,
              " applies to --strategy whole_tensor only, not ", p.strategy);
  TORCH_CHECK(!whole || !p.wrap_policy.min_params.has_value(),
              "--strategy whole_tensor makes each of the model's blocks a unit; --wrap-policy '",
              p.wrap_policy, "' is not supported with it");
  TORCH_CHECK(p.shard_dim >= 0, "--shard-dim must be >= 0, got ", p.shard_dim);
  TORCH_CHECK(p.shard_dim == 0 || !whole, "--shard-dim ", p.shard_dim,
              " splits tensors along a dim, but --strategy whole_tensor keeps each tensor whole");
  TORCH_CHECK(p.reshard_after_forward >= 0,
              "--reshard-after-forward must be 0, 1 or a group size >= 2, got ",
              p.reshard_after_forward);
  TORCH_CHECK(p.reshard_after_forward <= 1 || p.strategy == ShardingStrategy::kFullShard ||
                  p.strategy == ShardingStrategy::kHybridShard,
              "--reshard-after-forward ", p.reshard_after_forward,
              " (a group size) applies to --strategy full_shard and hybrid_shard, not ",
              p.strategy);
  TORCH_CHECK(p.replicate == 1 || p.strategy == ShardingStrategy::kHybridShard, "--replicate ",
              p.replicate, " applies to --strategy hybrid_shard only, not ", p.strategy);
}

// --strategy and the sizes of its groups.
void check_sharding(const JobConfig& o, int world) {
  const ParallelismConfig& p = o.parallelism;
  check_strategy_settings(p, o.training.accum_mode);
  tools::check_head_unit(p);
  TORCH_CHECK(p.replicate >= 1 && world % p.replicate == 0, "--replicate ", p.replicate,
              " does not divide the world size ", world);
  const int shard_group =
      p.strategy == ShardingStrategy::kHybridShard ? world / p.replicate : world;
  TORCH_CHECK(p.reshard_after_forward <= 1 || shard_group % p.reshard_after_forward == 0,
              "--reshard-after-forward ", p.reshard_after_forward,
              " (a group size) does not divide the shard group of ", shard_group, " ranks");
  check_all_gather(p, shard_group);
}

// Mixed precision and fp16's gradient scaler: in range, and given only where they apply.
void check_precision(const JobConfig& o) {
  const ParallelismConfig& p = o.parallelism;
  const GradScalerConfig& g = o.training.grad_scaler;
  TORCH_CHECK(p.param_dtype == at::kHalf || g == GradScalerConfig{},
              "--init-scale, --growth-factor, --backoff-factor and --growth-interval set fp16's "
              "gradient scaler; they need --param-dtype fp16, not ",
              dtype_name(p.param_dtype));
  TORCH_CHECK(std::isfinite(g.init_scale) && g.init_scale > 0 &&
                  g.init_scale <= std::numeric_limits<float>::max(),
              "--init-scale must be a positive float32 value, got ", g.init_scale);
  TORCH_CHECK(std::isfinite(g.growth_factor) && g.growth_factor > 1,
              "--growth-factor must be greater than 1, got ", g.growth_factor);
  TORCH_CHECK(g.backoff_factor > 0 && g.backoff_factor < 1,
              "--backoff-factor must be in (0, 1), got ", g.backoff_factor);
  TORCH_CHECK(g.growth_interval >= 1 && g.growth_interval <= std::numeric_limits<int32_t>::max(),
              "--growth-interval must be in [1, 2^31), got ", g.growth_interval);
  TORCH_CHECK(!p.no_fsdp || (p.param_dtype == at::kFloat && !p.reduce_dtype.has_value()),
              "--no-fsdp trains in fp32; --param-dtype ", dtype_name(p.param_dtype),
              " and --reduce-dtype '", p.reduce_dtype ? dtype_name(*p.reduce_dtype) : "",
              "' need FSDP");
  TORCH_CHECK(o.checkpoint.export_dtype == at::kFloat || o.checkpoint.export_dtype == at::kBFloat16,
              "--export-dtype must be fp32 or bf16, got '", dtype_name(o.checkpoint.export_dtype),
              "'");
}

// --device, --offload and the gradient-division settings need what they act on.
void check_placement(const ParallelismConfig& p) {
  TORCH_CHECK(p.device != DeviceKind::kCuda || at::hasCUDA(),
              "--device cuda: no CUDA device is visible to this process");
  TORCH_CHECK(!p.offload || !p.no_fsdp,
              "--offload keeps FSDP's sharded state in host memory; --no-fsdp has none");
  TORCH_CHECK((p.gradient_divide_factor == 0 && !p.force_sum_reduction) || !p.no_fsdp,
              p.force_sum_reduction ? "--force-sum-reduction" : "--gradient-divide-factor",
              " sets how FSDP reduces gradients; --no-fsdp reduces none");
}

void check_checkpointing(const CheckpointConfig& c, const ModelConfig& m) {
  TORCH_CHECK(c.save_every >= 0, "--save-every must be non-negative, got ", c.save_every);
  TORCH_CHECK(c.save_every == 0 || !c.save_dir.empty(), "--save-every needs --save DIR");
  TORCH_CHECK(c.format == checkpoint::CheckpointFormat::kSharded || !c.save_dir.empty(),
              "--checkpoint-format ", checkpoint::checkpoint_format_name(c.format),
              " is the layout of --save's checkpoints; give --save DIR");
  TORCH_CHECK(c.resume.empty() || m.init_from.empty(),
              "--resume and --init-from both set the weights; give one of them");
  TORCH_CHECK(c.resume != "auto" || !c.save_dir.empty(),
              "--resume auto resumes from the --save directory; give --save DIR");
  TORCH_CHECK(c.export_max_shard_bytes >= 0, "--export-max-shard-bytes must be non-negative, got ",
              c.export_max_shard_bytes);
}

// "model 'tiny'", with the size flags that changed it ("... with --n-positions 32").
std::string model_named(const ModelConfig& m) {
  std::string out = "model '" + m.name + "'";
  const std::pair<const char*, int64_t> overrides[] = {{"--vocab-size", m.vocab_size},
                                                       {"--n-positions", m.n_positions},
                                                       {"--n-embd", m.n_embd},
                                                       {"--n-layer", m.n_layer},
                                                       {"--n-head", m.n_head}};
  std::string given;
  for (const auto& [flag, value] : overrides) {
    if (value != 0)
      given += std::string(given.empty() ? "" : " ") + flag + " " + std::to_string(value);
  }
  return given.empty() ? out : out + " with " + given;
}

// The model against the sequence length and the data's token ids.
void check_model_fits_data(const JobConfig& o, const models::ModelSpec& spec) {
  TORCH_CHECK(o.training.seq_len >= 1 && o.training.seq_len <= spec.max_seq_len(), "--seq-len ",
              o.training.seq_len, " is outside [1, ", spec.max_seq_len(), "], the positions ",
              model_named(o.model), " has");
  TORCH_CHECK(!feeds_bytes(o) || spec.vocab_size() >= kByteVocab, model_named(o.model),
              " has vocab_size ", spec.vocab_size(), ", fewer than the ", kByteVocab,
              " byte-level token ids the trainer feeds");
}

}  // namespace

std::shared_ptr<const models::ModelSpec> model_spec_of(const JobConfig& o,
                                                       JobTokenizer& tokenizer) {
  const ModelConfig& m = o.model;
  const auto spec = models::resolve_model_spec(m.name);
  models::SizeOverrides overrides = size_overrides(m);
  // A tokenizer's vocabulary is a registered model's, unless --vocab-size says otherwise; a
  // Hugging Face model keeps its own (often padded past the tokenizer's ids, which load_datasets
  // checks fit).
  if (m.vocab_size == 0 && !o.data.tokenizer.empty() && !models::is_pretrained_dir(m.name)) {
    overrides.vocab_size = tokenizer.get()->vocab_size();
  }
  if (overrides.vocab_size == 0 && overrides.max_seq_len == 0 && overrides.dim == 0 &&
      overrides.n_layers == 0 && overrides.n_heads == 0) {
    return spec;
  }
  try {
    return spec->with_overrides(overrides);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "--vocab-size, --n-positions, --n-embd, --n-layer or --n-head: ",
                e.what_without_backtrace());
  }
}

std::shared_ptr<const models::ModelSpec> check_job(const JobConfig& o, int world,
                                                   JobTokenizer& tokenizer) {
  check_tensor_parallel(o, world);
  check_batch(o.training, world / o.parallelism.tp);
  check_schedule_and_val(o);
  check_sharding(o, world);
  check_precision(o);
  check_placement(o.parallelism);
  check_checkpointing(o.checkpoint, o.model);
  auto spec = model_spec_of(o, tokenizer);
  check_model_fits_data(o, *spec);
  if (o.parallelism.tp > 1) {
    try {
      // The model has plans, and its sizes divide.
      spec->unit_tp_plan(o.parallelism.tp, o.parallelism.sequence_parallel);
      spec->root_tp_plan(o.parallelism.tp, o.parallelism.sequence_parallel);
    } catch (const c10::Error& e) {
      TORCH_CHECK(false, "--tp ", o.parallelism.tp, ": ", e.what_without_backtrace());
    }
  }
  return spec;
}

std::shared_ptr<const models::ModelSpec> validate(const JobConfig& o, int world) {
  JobTokenizer tokenizer(o);
  auto spec = check_job(o, world, tokenizer);
  if (!o.data.path.empty() || !o.data.val_path.empty()) {
    load_datasets(o, spec->vocab_size(), tokenizer);  // fails early on a missing or short file
  }
  return spec;
}

}  // namespace fsdp::train
