// The flags of a training job's settings: see job_flags.h.
#include <common/job_flags.h>

#include <common/backend_flags.h>
#include <common/cli_checks.h>
#include <common/model_flags.h>
#include <fsdp/data/corpus.h>
#include <fsdp/models/model.h>

namespace fsdp::tools {
namespace {

using train::name_of;
using train::names_joined;
using train::NameTable;
using train::value_named;

// A setting named by a table (--strategy, --param-dtype, ...): its flag takes the names only.
// value is a T, or a std::optional<T> for a setting that may stay unset.
template <class T, class Value>
CLI::Option* named(ConfigFlags& flags, const std::string& section, const std::string& names,
                   Value& value, const NameTable<T>& table, const std::string& help) {
  const std::string flag = names.substr(0, names.find(','));
  return flags.typed<T>(
      section, names, value,
      [flag, &table](const std::string& text) { return value_named(table, flag, text); },
      [&table](const T& v) { return name_of(table, v); }, help + ": " + names_joined(table));
}

// A data spec (fsdp/data/corpus.h): every entry an existing file or a pattern matching some.
CLI::Validator data_spec() {
  return CLI::Validator(
      [](std::string& spec) -> std::string {
        try {
          fsdp::data::expand_data_spec(spec);
        } catch (const std::exception& e) {
          return e.what();
        }
        return "";
      },
      "SPEC");
}

// --model: a registered model name, or a Hugging Face model directory (one holding config.json;
// models::resolve_model_spec reads either).
CLI::Validator model_name_or_dir() {
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

CLI::Validator non_empty() {
  return CLI::Validator(
      [](std::string& text) -> std::string { return text.empty() ? "must not be empty" : ""; },
      "TEXT");
}

const CLI::Validator kPositive = integer_at_least(1);
const CLI::Validator kNonNegative = integer_at_least(0);

}  // namespace

void add_model_flags(ConfigFlags& flags, train::ModelConfig& m) {
  flags
      .value("model", "--model", m.name,
             "Model config: " + fsdp::models::model_names_joined() +
                 ", or a Hugging Face model directory (its config.json names one of "
                 "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
                 "GPT2LMHeadModel)")
      ->check(model_name_or_dir())
      ->capture_default_str();
  // Size overrides: 0 (unset) keeps the model's own.
  const auto size = [&](const std::string& flag, int64_t& value, const std::string& help) {
    CLI::Option* option = flags.value("model", flag, value, help);
    option->check(kPositive);
    flags.unset_when(option, "0");
  };
  size("--vocab-size", m.vocab_size,
       "Override the model's vocab_size (default: a --tokenizer's, else the model's)");
  size("--n-positions", m.n_positions,
       "Override the model's longest sequence (GPT-2 n_positions, Llama "
       "max_position_embeddings)");
  size("--n-embd", m.n_embd, "Override the model's width (GPT-2 n_embd, Llama hidden_size)");
  size("--n-layer", m.n_layer, "Override the model's number of layers");
  size("--n-head", m.n_head, "Override the model's attention heads");
  flags.flag("model", "--activation-checkpoint", m.activation_checkpoint,
             "Every transformer block recomputes its forward in backward instead of keeping "
             "activations");
}

void add_init_flag(ConfigFlags& flags, train::ModelConfig& m) {
  flags
      .value("model", "--init-from", m.init_from,
             "Initialize the model from Hugging Face weights: a model.safetensors file, or a "
             "sharded checkpoint (its model.safetensors.index.json, or the directory)")
      ->check(hf_weights());
}

void add_batch_flags(ConfigFlags& flags, train::TrainingConfig& t) {
  flags.value("training", "--global-batch", t.global_batch, "Sequences per step over all ranks")
      ->check(kPositive)
      ->capture_default_str();
  flags.value("training", "--seq-len", t.seq_len, "Tokens per sequence")
      ->check(kPositive)
      ->capture_default_str();
  flags
      .value("training", "--grad-accum", t.grad_accum,
             "Micro-batches per optimizer step, each 1/K of the rank's batch")
      ->check(integer_at_least(1, 2147483647))
      ->capture_default_str();
  named(flags, "training", "--accum-mode", t.accum_mode, train::accumulation_mode_names(),
        "sync: reduce every micro-batch; no-sync: reduce once per step; no-reshard: also keep "
        "parameters gathered across micro-batches; no-all-reduce (hybrid_shard, no_shard): "
        "reduce-scatter every micro-batch, all-reduce across replicas once per step");
}

namespace {

// The learning-rate schedule.
void add_schedule_flags(ConfigFlags& flags, train::TrainingConfig& t) {
  named(flags, "training", "--lr-schedule", t.lr_schedule, train::lr_schedule_names(),
        "Learning-rate schedule after warm-up: constant, cosine (to --min-lr) or wsd (warmup, "
        "stable, linear decay to --min-lr over the last --decay-frac of the steps)");
  flags
      .value("training", "--warmup-steps", t.warmup_steps,
             "Linear learning-rate warm-up over the first N steps")
      ->check(kNonNegative)
      ->capture_default_str();
  flags.value("training", "--min-lr", t.min_lr, "Final learning rate of cosine and wsd")
      ->check(finite_in(0, 1e6))
      ->capture_default_str();
  flags.value("training", "--decay-frac", t.decay_frac, "wsd: fraction of the steps that decay")
      ->check(finite_in(0, 1))
      ->capture_default_str();
}

// fp16's dynamic loss scaling: torch.amp.GradScaler's parameters, names and defaults.
void add_grad_scaler_flags(ConfigFlags& flags, train::GradScalerConfig& g) {
  flags
      .value("training", "--init-scale", g.init_scale,
             "fp16: the first loss scale (the loss is multiplied by it before backward, the "
             "gradient shards divided by it after)")
      ->check(finite_in(0, 3.4e38, /*open_min=*/true))
      ->capture_default_str();
  flags
      .value("training", "--growth-factor", g.growth_factor,
             "fp16: multiplies the loss scale after --growth-interval steps in a row without "
             "overflow")
      ->check(finite_in(1, 1e6, /*open_min=*/true))
      ->capture_default_str();
  flags
      .value("training", "--backoff-factor", g.backoff_factor,
             "fp16: multiplies the loss scale after a step whose gradients overflowed on any "
             "rank (that step is skipped on every rank); in (0, 1)")
      ->check(finite_in(0, 1, /*open_min=*/true))
      ->capture_default_str();
  flags
      .value("training", "--growth-interval", g.growth_interval,
             "fp16: steps without overflow before the loss scale grows")
      ->check(integer_at_least(1, 2147483647))
      ->capture_default_str();
}

}  // namespace

void add_optimizer_flags(ConfigFlags& flags, train::TrainingConfig& t) {
  flags.value("training", "--steps", t.steps, "Optimizer steps")
      ->check(kNonNegative)
      ->capture_default_str();
  flags.value("training", "--lr", t.lr, "AdamW learning rate")
      ->check(finite_in(0, 1e6, /*open_min=*/true))
      ->capture_default_str();
  flags.value("training", "--weight-decay", t.weight_decay, "AdamW weight decay")
      ->check(finite_in(0, 1e6))
      ->capture_default_str();
  flags.flag("training", "--decay-all", t.decay_all,
             "Weight decay on every parameter; by default only 2-D and larger ones (matrices, "
             "embeddings) decay, as in nanoGPT and torchtitan, and biases and norm weights do "
             "not");
  flags
      .value("training", "--max-grad-norm", t.max_grad_norm,
             "Clip the global gradient norm to this (inf: no clipping)")
      ->check(positive_or_inf())
      ->capture_default_str();
  flags
      .value("training", "--skip-nonfinite", t.skip_nonfinite,
             "Skip up to N steps whose loss or gradient norm is not finite (no rank updates); "
             "the next one stops training. 0: the first one stops it, naming the step, the "
             "ranks and the first unit with a non-finite gradient")
      ->check(kNonNegative)
      ->capture_default_str();
  flags.value("training", "--seed", t.seed, "Seed of the initial weights and of batch sampling")
      ->check(kNonNegative)
      ->capture_default_str();
  add_schedule_flags(flags, t);
  add_grad_scaler_flags(flags, t.grad_scaler);
}

void add_data_flags(ConfigFlags& flags, train::DataConfig& d) {
  flags
      .value("data", "--data", d.path,
             "Training data: a text file (its bytes are the tokens), llm.c .bin shards, or with "
             "--tokenizer text, .jsonl and .bin files, comma-separated, globs; default: the "
             "embedded corpus. Fine-tuning .jsonl (prompt/completion, or input_ids/labels, "
             "which need no tokenizer) and labeled shards train their unmasked tokens only")
      ->check(data_spec());
  flags
      .value("data", "--tokenizer", d.tokenizer,
             "tokenizer.json (tokenizer_config.json beside it names BOS/EOS) that tokenizes "
             "--data and --val-data; the model's vocabulary becomes the tokenizer's")
      ->check(existing_file());
  flags.value("data", "--text-field", d.text_field, "The field holding a .jsonl document's text")
      ->check(non_empty())
      ->capture_default_str();
  flags
      .value("data", "--val-data", d.val_path,
             "Held-out data for --val-every, read as --data (default, when training on the "
             "embedded corpus: its held-out last 10%, which does not train)")
      ->check(data_spec());
  flags
      .value("data", "--val-every", d.val_every, "Held-out loss every N steps (0: only at the end)")
      ->check(kNonNegative)
      ->capture_default_str();
  flags.value("data", "--val-batches", d.val_batches, "Global batches per held-out evaluation")
      ->check(kPositive)
      ->capture_default_str();
}

void add_sharding_flags(ConfigFlags& flags, train::ParallelismConfig& p) {
  flags.flag("parallelism", "--no-fsdp", p.no_fsdp,
             "Single-process plain LibTorch reference on the same global batch");
  named(flags, "parallelism", "--strategy", p.strategy, train::strategy_names(),
        "full_shard (ZeRO-3), shard_grad_op (ZeRO-2), no_shard (DDP), hybrid_shard (HSDP) or "
        "whole_tensor (inter-tensor ZeRO-3: each tensor whole on one rank)");
  flags
      .value("parallelism", "--reshard-after-forward", p.reshard_after_forward,
             "1: blocks free their gathered parameters after forward; 0: they keep them until "
             "backward; N >= 2: they keep a 1/N piece and backward gathers within groups of N "
             "ranks (ZeRO++ hpZ; N divides the shard group)")
      ->check(integer_at_least(0, 2147483647))
      ->capture_default_str();
  flags
      .value("parallelism", "--replicate", p.replicate,
             "hybrid_shard: replicas (the shard groups have W / R ranks)")
      ->check(integer_at_least(1, 2147483647))
      ->capture_default_str();
  flags
      .value("parallelism", "--shard-dim", p.shard_dim,
             "Shard every parameter with more than D dims along dim D (FSDP2's "
             "shard_placement_fn returning Shard(D)), the others along dim 0")
      ->check(kNonNegative)
      ->capture_default_str();
  flags
      .value("parallelism", "--evenness-priority", p.evenness_priority,
             "whole_tensor: 1 places tensors for even bytes per rank; lower keeps a block's "
             "tensors on fewer ranks (fewer broadcasts) at the cost of balance")
      ->check(finite_in(0, 1))
      ->capture_default_str();
  named(flags, "parallelism", "--param-dtype", p.param_dtype, train::compute_dtype_names(),
        "Compute and all-gather dtype (masters stay fp32)");
  named(flags, "parallelism", "--reduce-dtype", p.reduce_dtype, train::compute_dtype_names(),
        "Gradient reduction dtype (default: --param-dtype)");
  flags
      .value("parallelism", "--prefetch", p.prefetch,
             "Units gathered ahead of the one computing (implicit prefetch depth; 0: off)")
      ->check(integer_at_least(0, 64))
      ->capture_default_str();
  flags
      .value("parallelism", "--tp", p.tp,
             "Tensor parallelism over N consecutive ranks: each block's linear layers split "
             "column- and row-wise by the model's plan, FSDP over the W / N data-parallel ranks "
             "(1: off)")
      ->check(integer_at_least(1, 2147483647))
      ->capture_default_str();
  flags.flag("parallelism", "--sequence-parallel", p.sequence_parallel,
             "With --tp N: sequence parallelism, the activations between the split layers in N "
             "shards of the sequence (norms on 1/N of the tokens; each all-reduce becomes a "
             "reduce-scatter and an all-gather). --seq-len must divide by N");
  flags.flag("parallelism", "--head-unit", p.head_unit,
             "The output head is an FSDP unit of its own, kept gathered from its forward to its "
             "backward, its gather beside the blocks' forward and its reduction beside their "
             "backward; a tied embedding table is the head's, looked up from its shards");
}

void add_run_parallelism_flags(ConfigFlags& flags, train::ParallelismConfig& p) {
  flags.typed<train::AllGatherSetting>(
      "parallelism", "--all-gather", p.all_gather, train::parse_all_gather,
      [](const train::AllGatherSetting& s) { return train::to_string(s); },
      "Every unit's weight all-gather: fp (in the compute dtype) or int8[:BLOCK] (ZeRO++ qwZ: "
      "blockwise int8, one fp32 scale per BLOCK elements, default 256; the fp32 shards the "
      "optimizer steps stay exact)");
  flags.typed<train::WrapPolicySetting>(
      "parallelism", "--wrap-policy", p.wrap_policy, train::parse_wrap_policy,
      [](const train::WrapPolicySetting& s) { return train::to_string(s); },
      "FSDP units: block (each transformer block, sharded as it is built) or min-params:N "
      "(FSDP1's size-based auto-wrap: a module owning at least N parameter elements not in a "
      "unit below it); the root is always a unit");
  flags
      .value("parallelism", "--gradient-divide-factor", p.gradient_divide_factor,
             "Divide the summed gradients by F instead of averaging them over the data-parallel "
             "ranks (FSDP2's set_gradient_divide_factor; 0: unset)")
      ->check(finite_in(0, 1e300))
      ->capture_default_str();
  flags.flag("parallelism", "--force-sum-reduction", p.force_sum_reduction,
             "Every gradient collective sums, the division a separate scaling (FSDP2's "
             "set_force_sum_reduction_for_comms)");
  flags.flag("parallelism", "--offload", p.offload,
             "Keep sharded parameters, gradients and optimizer state in host memory (FSDP2's "
             "CPUOffloadPolicy; pinned with --device cuda); the optimizer steps on the host");
  named(flags, "parallelism", "--device", p.device, train::device_names(),
        "Where each rank computes: the CPU, or its process group's GPU (needs a backend that "
        "communicates on cuda: --backend auto picks nccl)");
}

void add_checkpoint_flags(ConfigFlags& flags, train::CheckpointConfig& c) {
  flags
      .value("checkpoint", "--save", c.save_dir,
             "Write sharded checkpoints under this directory (at the end, and see --save-every)")
      ->check(output_dir(/*created_with_parents=*/true));
  flags.value("checkpoint", "--save-every", c.save_every, "Also save a checkpoint every N steps")
      ->check(kNonNegative)
      ->capture_default_str();
  named(flags, "checkpoint", "--checkpoint-format", c.format, train::checkpoint_format_names(),
        "Layout of --save's checkpoints: sharded (ours) or dcp-hf (PyTorch DCP's "
        "HuggingFaceStorageWriter layout, which FSDP2 loads); --resume reads either");
  flags
      .value("checkpoint", "--resume", c.resume,
             "Continue from this checkpoint directory (or a --save directory: its latest); "
             "'auto': from --save DIR's latest when there is one, else start fresh (a restarted "
             "job runs the same command)")
      ->check(existing_dir() | CLI::IsMember({"auto"}));
  flags
      .value("checkpoint", "--export", c.export_path,
             "Write the final model as Hugging Face safetensors of the model's transformers "
             "class (config.json beside it)")
      ->check(output_file(/*created_with_parents=*/true));
  named(flags, "checkpoint", "--export-dtype", c.export_dtype, train::export_dtype_names(),
        "Element type of --export");
  flags
      .value("checkpoint", "--export-max-shard-bytes", c.export_max_shard_bytes,
             "Split --export into model-<k>-of-<n>.safetensors files of at most this many "
             "tensor bytes with an index, as save_pretrained(max_shard_size) (0: one file)")
      ->check(kNonNegative)
      ->capture_default_str();
}

void add_metrics_flags(ConfigFlags& flags, train::MetricsConfig& m) {
  flags
      .value("metrics", "--metrics", m.path,
             "Write one JSON object per step to this file (rank 0); on fine-tuning data its "
             "tokens_per_s counts trained (unmasked) targets only")
      ->check(output_file());
  flags.value("metrics", "--log-every", m.log_every, "Print progress every N steps")
      ->check(kPositive)
      ->capture_default_str();
  flags.flag("metrics", "--quiet", m.quiet, "No progress lines");
  flags
      .value("metrics", "--trace", m.trace_dir,
             "Write each rank's timeline (Chrome trace JSON) to DIR/rank<N>.json, and its flight "
             "record there if a collective fails")
      ->check(output_dir());
  flags
      .value("metrics", "--tensorboard", m.tensorboard_dir,
             "Write the step's scalars (loss, lr, grad norm, throughput, memory) as a TensorBoard "
             "event file in DIR (rank 0)")
      ->check(output_dir());
}

void add_debug_flags(ConfigFlags& flags, train::DebugConfig& d) {
  flags
      .value("debug", "--dump-batches", d.dump_batches_path,
             "Write every step's global (inputs, targets) batch to this file (rank 0; format "
             "in trainer.h; fine-tuning data's masked targets are -100)")
      ->check(output_file());
}

void add_launch_flags(ConfigFlags& flags, train::LaunchConfig& l) {
  CLI::Option* nproc =
      flags.value("launch", "--nproc", l.nproc,
                  "Launch this many local ranks (default 2 unless RANK/WORLD_SIZE are set)");
  nproc->check(integer_at_least(1, 2147483647));
  flags.unset_when(nproc, "0");
  flags.value("launch", "--backend", l.backend, kBackendHelp)
      ->check(CLI::IsMember(backend_choices()))
      ->capture_default_str();
  flags.value("launch", "--timeout-s", l.timeout_s, "Collective and rendezvous timeout in seconds")
      ->check(finite_in(0, 1e7, /*open_min=*/true))
      ->capture_default_str();
}

namespace {

// The sharded state's dtype: fsdp-train's masters are fp32; the estimator also takes others.
const NameTable<at::ScalarType>& master_dtype_names() {
  static const NameTable<at::ScalarType> table = {
      {"fp32", at::kFloat}, {"bf16", at::kBFloat16}, {"fp16", at::kHalf}, {"fp64", at::kDouble}};
  return table;
}

// Every "section.key" of fsdp-train's settings.
std::vector<std::string> job_keys() {
  CLI::App app;
  train::JobConfig job;
  ConfigFlags flags(app);
  add_job_flags(flags, job);
  std::vector<std::string> keys;
  for (const ConfigFlag& f : flags.flags()) keys.push_back(f.section + "." + f.key);
  return keys;
}

}  // namespace

void add_prediction_flags(ConfigFlags& flags, ModelFlags& f) {
  add_model_flags(flags, f.job.model);
  add_batch_flags(flags, f.job.training);
  add_sharding_flags(flags, f.job.parallelism);
  CLI::Option* world =
      flags.value("launch", "--world-size,--nproc", f.world, "Ranks of the run predicted");
  world->check(integer_at_least(1, 2147483647))->capture_default_str();
  flags.set_key(world, "nproc");  // fsdp-train's [launch] nproc
  named(flags, "parallelism", "--master-dtype", f.master_dtype, master_dtype_names(),
        "dtype of sharded parameters, gradients and optimizer state");
  flags.ignore_keys(job_keys());
}

void add_job_flags(ConfigFlags& flags, train::JobConfig& job) {
  add_model_flags(flags, job.model);
  add_init_flag(flags, job.model);
  add_batch_flags(flags, job.training);
  add_optimizer_flags(flags, job.training);
  add_data_flags(flags, job.data);
  add_sharding_flags(flags, job.parallelism);
  add_run_parallelism_flags(flags, job.parallelism);
  add_checkpoint_flags(flags, job.checkpoint);
  add_metrics_flags(flags, job.metrics);
  add_debug_flags(flags, job.debug);
  add_launch_flags(flags, job.launch);
}

}  // namespace fsdp::tools
