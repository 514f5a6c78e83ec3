// One training job's settings, typed and grouped in sections as torchtitan's job config groups
// them (model, training, data, parallelism, checkpoint, metrics, debug, launch). A program
// parses its command line (and fsdp-train's --config TOML file) into a JobConfig once; every
// value is checked then, and code that uses a setting reads its typed value, never the text it
// came from. tools/common/job_flags.h defines each setting's flag, TOML key, help and allowed
// values in one place for every program that takes it.
//
// Settings that need more than one value to check (the global batch divisible by the ranks,
// --replicate dividing the world, ...) are checked by fsdp::train::validate (trainer.h).
#pragma once

#include <fsdp/checkpoint/checkpoint.h>
#include <fsdp/sharding_strategy.h>
#include <fsdp/train/lr_schedule.h>

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::models {
struct SizeOverrides;  // fsdp/models/model.h
}  // namespace fsdp::models

namespace fsdp::train {

enum class DeviceKind { kCpu, kCuda };

// A typed setting's names: the name every program, config file and error uses for each value,
// in the order help texts list them.
template <class T>
using NameTable = std::vector<std::pair<std::string, T>>;

const NameTable<ShardingStrategy>& strategy_names();
const NameTable<AccumulationMode>& accumulation_mode_names();
const NameTable<LrScheduleKind>& lr_schedule_names();
const NameTable<DeviceKind>& device_names();
// fp32, bf16, fp16: the dtypes of compute and gradient reduction.
const NameTable<at::ScalarType>& compute_dtype_names();
// sharded, dcp-hf: the layouts of saved checkpoints (fsdp/checkpoint/checkpoint.h).
const NameTable<checkpoint::CheckpointFormat>& checkpoint_format_names();
// fp32, bf16: the dtypes an export writes.
const NameTable<at::ScalarType>& export_dtype_names();

// name_of(table, value): the value's name. value_named(table, what, name): the value called
// name; throws "<what> must be a, b or c, got 'name'" otherwise. (Defined below.)

// Every unit's weight all-gather: in the compute dtype, or ZeRO++ qwZ's blockwise int8 with one
// fp32 scale per int8_block elements (fsdp::Int8AllGather).
struct AllGatherSetting {
  std::optional<int64_t> int8_block;  // nullopt: "fp"
  bool operator==(const AllGatherSetting& other) const { return int8_block == other.int8_block; }
};
// "fp", "int8" (block 256) or "int8:BLOCK" (1 <= BLOCK, at most 9 digits); throws naming
// --all-gather and the text otherwise.
AllGatherSetting parse_all_gather(const std::string& text);
std::string to_string(const AllGatherSetting& setting);

// Which modules are FSDP units: the model's blocks, or FSDP1's size-based auto-wrap over the
// whole built model (fsdp/wrap_policy.h) with a threshold of min_params parameter elements.
struct WrapPolicySetting {
  std::optional<int64_t> min_params;  // nullopt: "block"
  bool operator==(const WrapPolicySetting& other) const { return min_params == other.min_params; }
};
// "block" or "min-params:N" (1 <= N, at most 18 digits); throws naming --wrap-policy otherwise.
WrapPolicySetting parse_wrap_policy(const std::string& text);
std::string to_string(const WrapPolicySetting& setting);

struct ModelConfig {
  std::string name = "tiny";  // a registered model (models::model_names())
  // Size overrides; 0 keeps the model's own (models::SizeOverrides). A tokenizer's vocabulary
  // replaces the model's unless vocab_size is given.
  int64_t vocab_size = 0;
  int64_t n_positions = 0;
  int64_t n_embd = 0;
  int64_t n_layer = 0;
  int64_t n_head = 0;
  // Initial weights from Hugging Face safetensors: a file, a directory (model.safetensors or a
  // sharded model.safetensors.index.json) or an index file. Empty: the model's seeded init.
  std::string init_from;
  bool activation_checkpoint = false;  // every block recomputes its forward in backward
};

// fp16's dynamic loss scaling (fsdp/grad_scaler.h; torch.amp.GradScaler's names and defaults),
// on with param_dtype fp16 only.
struct GradScalerConfig {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  bool operator==(const GradScalerConfig& other) const {
    return init_scale == other.init_scale && growth_factor == other.growth_factor &&
           backoff_factor == other.backoff_factor && growth_interval == other.growth_interval;
  }
};

struct TrainingConfig {
  int64_t steps = 2000;
  int64_t global_batch = 16;  // sequences per optimizer step, over all ranks
  int64_t seq_len = 64;
  int grad_accum = 1;  // micro-batches per optimizer step
  AccumulationMode accum_mode = AccumulationMode::kSync;
  double lr = 3e-3;
  // On 2-D and larger parameters (matrices, embeddings) only, as nanoGPT and torchtitan: biases
  // and norm weights do not decay, unless decay_all.
  double weight_decay = 0.1;
  bool decay_all = false;
  double max_grad_norm = 1.0;
  int64_t skip_nonfinite = 0;  // steps with a non-finite loss or gradient norm to skip; then stop
  int64_t seed = 1234;         // of the initial weights and of batch sampling
  // Learning-rate schedule (fsdp/train/lr_schedule.h) after warmup_steps of linear warm-up, down to
  // min_lr; wsd decays over the last decay_frac of the steps.
  LrScheduleKind lr_schedule = LrScheduleKind::kConstant;
  int64_t warmup_steps = 0;
  double min_lr = 0;
  double decay_frac = 0.2;
  GradScalerConfig grad_scaler;
};

// The training data (sources.h): a text file taken as bytes, llm.c .bin shards, or with a
// tokenizer any spec fsdp::data::TokenCorpus takes. Empty path: the embedded corpus.
struct DataConfig {
  std::string path;
  std::string tokenizer;            // tokenizer.json (tokenizer_config.json beside it); "": bytes
  std::string text_field = "text";  // the field of a .jsonl document
  // Held-out loss: val_batches global batches of val_path (empty: with the embedded corpus,
  // its held-out last 10%; with a path, none), from a fixed seed so that every evaluation sees
  // the same tokens, every val_every steps (0: only at the end) and at the end.
  std::string val_path;
  int64_t val_every = 200;
  int64_t val_batches = 4;
};

struct ParallelismConfig {
  bool no_fsdp = false;  // plain single-process LibTorch: the reference of every sharded run
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  // Blocks' reshard_after_forward: 1 true, 0 false, N >= 2 the int N (hpZ group size).
  int reshard_after_forward = 1;
  int replicate = 1;  // hybrid_shard: size of the replicate dimension (divides W)
  // Tensor parallelism over tp consecutive ranks (each block's linear layers split by the
  // model's plan), FSDP over the W / tp data-parallel ranks; 1: off.
  int tp = 1;
  // Under tp > 1: the activations between the tensor-parallel layers split along the sequence
  // (Megatron-LM's sequence parallelism: reduce-scatter and all-gather for each all-reduce,
  // norms on 1/tp of the tokens).
  bool sequence_parallel = false;
  // Shard(shard_dim) for every parameter with more than shard_dim dims, Shard(0) for the others
  // (FSDP2's shard_placement_fn); 0: Shard(0) everywhere.
  int64_t shard_dim = 0;
  // whole_tensor: the partition's evenness priority in [0, 1] (1: balance bytes only; lower:
  // keep a unit's tensors on fewer ranks, fewer broadcasts per unit).
  double evenness_priority = 1.0;
  AllGatherSetting all_gather;
  at::ScalarType param_dtype = at::kFloat;     // of forward/backward compute
  std::optional<at::ScalarType> reduce_dtype;  // nullopt: param_dtype
  WrapPolicySetting wrap_policy;
  int prefetch = 1;  // implicit prefetch depth in units (0: off)
  // The model's output head an FSDP unit of its own, kept gathered from its forward to its
  // backward (torchtitan's last unit): its gather is prefetched beside the blocks' forward and its
  // reduction runs beside their backward. A tied embedding table is then the head unit's, and the
  // embedding lookup reads its rows from the shards (fsdp::embedding): [Note: the head as a unit].
  bool head_unit = false;
  // FSDP2's set_gradient_divide_factor on every unit (0: unset, the data-parallel size) and
  // set_force_sum_reduction_for_comms.
  double gradient_divide_factor = 0;
  bool force_sum_reduction = false;
  // FSDP2's CPUOffloadPolicy on every unit: sharded parameters, gradients and optimizer state in
  // host memory (pinned with cuda), the optimizer stepping there.
  bool offload = false;
  // Where forward and backward run: the CPU, or the process group's GPU (so a backend that
  // communicates on cuda; the reference under no_fsdp uses the current GPU).
  DeviceKind device = DeviceKind::kCpu;
};

// Checkpoints (include/fsdp/checkpoint/checkpoint.h). Empty paths turn each off.
struct CheckpointConfig {
  std::string save_dir;    // sharded checkpoints under this root, at the end of training
  int64_t save_every = 0;  // and every N steps (0: only at the end)
  // Their layout: ours, or PyTorch DCP's Hugging Face layout (fsdp/checkpoint/dcp_hf.h), which
  // FSDP2 loads. resume may be in either.
  checkpoint::CheckpointFormat format = checkpoint::CheckpointFormat::kSharded;
  // Continue from this checkpoint (or a root: its latest); "auto": from save_dir's latest if it
  // has one, else start fresh.
  std::string resume;
  std::string export_path;  // the final model, Hugging Face safetensors (config.json beside it)
  at::ScalarType export_dtype = at::kFloat;
  // > 0: split the export as transformers' save_pretrained(max_shard_size) does, into
  // model-<k>-of-<n>.safetensors files of at most this many tensor bytes, plus
  // model.safetensors.index.json (ExportOptions::max_shard_bytes). 0: one file.
  int64_t export_max_shard_bytes = 0;
};

struct MetricsConfig {
  std::string path;  // one JSON object per step (rank 0); empty: none
  int64_t log_every = 100;
  bool quiet = false;     // no progress lines
  std::string trace_dir;  // each rank's timeline as DIR/rank<N>.json; empty: none
  // Rank 0's TensorBoard event file in this directory (tensorboard_writer.h); empty: none.
  std::string tensorboard_dir;
};

struct DebugConfig {
  // Rank 0 writes every batch trained on here (format in trainer.h), for reference runners that
  // must train on exactly our tokens. Empty: off.
  std::string dump_batches_path;
};

// How the process becomes ranks: launched local ranks, or one rank of a launcher's job.
struct LaunchConfig {
  int nproc = 0;  // local ranks to launch; 0: 2, or one rank when a launcher started us
  std::string backend = "auto";
  double timeout_s = 300;  // collective and rendezvous timeout
};

struct JobConfig {
  ModelConfig model;
  TrainingConfig training;
  DataConfig data;
  ParallelismConfig parallelism;
  CheckpointConfig checkpoint;
  MetricsConfig metrics;
  DebugConfig debug;
  LaunchConfig launch;
};

// Settings in messages, written as their flags take them ("cosine", "int8:256", "bf16").
std::ostream& operator<<(std::ostream& out, LrScheduleKind kind);
std::ostream& operator<<(std::ostream& out, DeviceKind device);
std::ostream& operator<<(std::ostream& out, const AllGatherSetting& setting);
std::ostream& operator<<(std::ostream& out, const WrapPolicySetting& setting);
// "fp32", "bf16", "fp16" (or LibTorch's name for another dtype).
std::string dtype_name(at::ScalarType dtype);

// The model section's size overrides (0: the model's own), as ModelSpec::with_overrides takes
// them. The vocabulary is --vocab-size's only: a tokenizer's is the trainer's business.
models::SizeOverrides size_overrides(const ModelConfig& model);

// The dtype gradients are reduced in: reduce_dtype, else param_dtype.
inline at::ScalarType reduce_dtype_of(const ParallelismConfig& p) {
  return p.reduce_dtype.value_or(p.param_dtype);
}

template <class T>
std::string name_of(const NameTable<T>& table, T value) {
  for (const auto& [name, v] : table) {
    if (v == value) return name;
  }
  TORCH_CHECK(false, "fsdp: a setting's value has no name (", static_cast<int>(value), ")");
}

// "a, b or c": the names, for help texts and errors.
template <class T>
std::string names_joined(const NameTable<T>& table) {
  std::string out;
  for (size_t i = 0; i < table.size(); ++i) {
    out += (i == 0 ? "" : i + 1 == table.size() ? " or " : ", ") + table[i].first;
  }
  return out;
}

template <class T>
T value_named(const NameTable<T>& table, const std::string& what, const std::string& name) {
  for (const auto& [n, v] : table) {
    if (n == name) return v;
  }
  TORCH_CHECK(false, what, what.empty() ? "" : " ", "must be ", names_joined(table), ", got '",
              name, "'");
}

}  // namespace fsdp::train
