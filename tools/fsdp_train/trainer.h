// The training loop of fsdp-train: any registered model (models/model.h) on text as bytes or
// tokens (sources.h), sharded with fully_shard along the model's shard plan (one unit per
// transformer block plus the root) or, with no_fsdp, plain single-process LibTorch on the same
// global batch, which is the reference every sharded run must reproduce.
#pragma once

#include <fsdp/checkpoint/checkpoint.h>
#include <fsdp/comm/process_group.h>

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::models {
class ModelSpec;
}  // namespace fsdp::models

namespace fsdp::train {

struct TrainerOptions {
  std::string model = "tiny";  // a registered model name (models::model_names())
  int64_t vocab_size = 0;      // 0: the model's own; else overrides it (e.g. a tokenizer's)
  int64_t steps = 2000;
  int64_t global_batch = 16;  // sequences per optimizer step, over all ranks
  int64_t seq_len = 64;
  double lr = 3e-3;
  double weight_decay = 0.1;  // on 2-D and larger parameters, on every one with decay_all
  // Weight decay on 2-D and larger parameters only (matrices, embeddings), as nanoGPT and
  // torchtitan; biases and norm weights do not decay.
  bool decay_all = false;
  double max_grad_norm = 1.0;
  int64_t skip_nonfinite = 0;  // steps with a non-finite loss or gradient norm to skip; then stop
  uint64_t seed = 1234;
  // Blocks' reshard_after_forward: 1 true, 0 false, N >= 2 the int N (hpZ group size).
  int reshard_after_forward = 1;
  bool activation_checkpoint = false;  // every block checkpoints its forward (GPT2Options)
  // full_shard (ZeRO-3), shard_grad_op (ZeRO-2), no_shard (DDP), hybrid_shard (HSDP),
  // whole_tensor (inter-tensor ZeRO-3: each tensor whole on one rank, fsdp/runtime/whole_tensor.h).
  std::string strategy = "full_shard";
  // whole_tensor: the partition's evenness priority in [0, 1] (1: balance bytes only; lower:
  // keep a unit's tensors on fewer ranks, fewer broadcasts per unit).
  double evenness_priority = 1.0;
  // Every unit's weight all-gather: "fp" (in the compute dtype) or "int8[:BLOCK]" (ZeRO++ qwZ:
  // blockwise int8 with one fp32 scale per BLOCK elements, default 256; fsdp::Int8AllGather).
  std::string all_gather = "fp";
  // Shard(shard_dim) for every parameter with more than shard_dim dims, Shard(0) for the others
  // (FSDP2's shard_placement_fn); 0: Shard(0) everywhere.
  int shard_dim = 0;
  int replicate = 1;                 // hybrid_shard: size of the replicate dimension (divides W)
  std::string param_dtype = "fp32";  // fp32, bf16 or fp16: dtype of forward/backward compute
  std::string reduce_dtype;          // empty: param_dtype
  // fp16's dynamic loss scaling (fsdp/grad_scaler.h; torch.amp.GradScaler's names and defaults),
  // on with param_dtype "fp16" only.
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  int grad_accum = 1;               // micro-batches per optimizer step
  std::string accum_mode = "sync";  // sync | no-sync | no-reshard | no-all-reduce (see README)
  // FSDP2's set_gradient_divide_factor on every unit (0: unset, the data-parallel size) and
  // set_force_sum_reduction_for_comms.
  double gradient_divide_factor = 0;
  bool force_sum_reduction = false;
  // Which modules are FSDP units (parse_wrap_policy): "block", the model's units (each
  // transformer block, sharded as it is built), or "min-params:N", FSDP1's size-based auto-wrap
  // over the whole built model (fsdp/wrap_policy.h). The root is always a unit.
  std::string wrap_policy = "block";
  bool no_fsdp = false;
  // Where forward and backward run: "cpu" or "cuda" (the process group's GPU, so a backend that
  // communicates on cuda; the reference under --no-fsdp uses the current GPU).
  std::string device = "cpu";
  // FSDP2's CPUOffloadPolicy on every unit: sharded parameters, gradients and optimizer state in
  // host memory (pinned with --device cuda), the optimizer stepping there.
  bool offload = false;
  // The training data (sources.h): a text file taken as bytes, llm.c .bin shards, or with
  // tokenizer_path any spec fsdp::data::TokenCorpus takes. Empty: the embedded corpus.
  std::string data_path;
  std::string tokenizer_path;       // tokenizer.json (tokenizer_config.json beside it); "": bytes
  std::string text_field = "text";  // the field of a .jsonl document
  // Held-out loss: K global batches of val_data_path (empty: with the embedded corpus, its last
  // 10%, which then does not train; with --data, none), drawn from a fixed seed so every
  // evaluation sees the same tokens, forward only, every val_every steps (0: only at the end)
  // and at the end.
  std::string val_data_path;
  int64_t val_every = 200;
  int64_t val_batches = 4;
  // Learning-rate schedule (schedule.h): constant, cosine or wsd, after warmup_steps of linear
  // warm-up, down to min_lr; wsd decays over the last decay_frac of the steps.
  std::string lr_schedule = "constant";
  int64_t warmup_steps = 0;
  double min_lr = 0;
  double decay_frac = 0.2;
  std::string metrics_path;  // empty: no metrics file
  int64_t log_every = 100;
  bool quiet = false;     // no progress lines
  int prefetch = 1;       // implicit prefetch depth in units (0: off)
  std::string trace_dir;  // empty: no timeline; else DIR/rank<N>.json per rank
  // Checkpoints (include/fsdp/checkpoint/checkpoint.h). Empty strings turn each off.
  std::string save_dir;     // sharded checkpoints under this root, at the end of training
  int64_t save_every = 0;   // and every N steps (0: only at the end)
  std::string resume_dir;   // continue from this checkpoint (or root with `latest`); "auto": from
                            // save_dir's latest if it has one, else start fresh
  std::string export_path;  // write the final model here, Hugging Face safetensors
  std::string export_dtype = "fp32";  // fp32 or bf16
  // > 0: split the export as transformers' save_pretrained(max_shard_size) does, into
  // model-<k>-of-<n>.safetensors files of at most this many tensor bytes beside export_path,
  // plus model.safetensors.index.json (ExportOptions::max_shard_bytes). 0: one file.
  int64_t export_max_shard_bytes = 0;
  // The layout of save_dir's checkpoints: ours, or PyTorch DCP's Hugging Face layout
  // (fsdp/checkpoint/dcp_hf.h), which FSDP2 loads. resume_dir may be in either.
  checkpoint::CheckpointFormat checkpoint_format = checkpoint::CheckpointFormat::kSharded;
  // Initialize from Hugging Face safetensors: a file, a directory (model.safetensors or a
  // sharded model.safetensors.index.json) or an index file.
  std::string init_from;
  // Rank 0 writes every batch trained on here, for reference runners (bench/reference/) that
  // must train on exactly our tokens. Empty: off. The file, all integers little-endian int64:
  //   header: 8 bytes "FSDPBAT1", B, T, K: B sequences of T tokens per micro-batch over all
  //     ranks, K micro-batches (backward passes) per optimizer step;
  //   then per step, K records: step (1-based, as in --metrics), micro-batch (0..K-1), B*T
  //     inputs (row-major [B, T]), B*T targets (inputs shifted left by one token).
  // Rank r trains on rows [r*B/W, (r+1)*B/W) of each record, and the step's loss is the mean
  // of its K micro-batch losses.
  std::string dump_batches_path;
};

// One rank's numbers for a step, as written under "ranks" in the metrics file.
struct RankStepStats {
  int rank = 0;
  int64_t param_bytes = 0;
  int64_t grad_bytes = 0;
  int64_t optim_bytes = 0;
  int64_t peak_unsharded_bytes = 0;
  int64_t all_gather_bytes = 0;
  int64_t reduce_scatter_bytes = 0;
  // All-reduce payload: gradients across replicas (no_shard, hybrid_shard), the gradient norm
  // and, when the mesh's group is the world, the step's loss.
  int64_t all_reduce_bytes = 0;
  // whole_tensor: the broadcasts of parameters and the reduces of gradients to their owners.
  int64_t broadcast_bytes = 0;
  int64_t reduce_bytes = 0;
  // What the process has measured of itself (Linux; 0 elsewhere): its peak resident memory so
  // far (VmHWM), and the bytes it wrote during the step, to sockets and files alike
  // (/proc/self/io wchar: the bytes every collective sent, plus the small metrics writes).
  int64_t peak_rss_bytes = 0;
  int64_t sent_bytes = 0;
  // With --metrics, CPU tensors are counted by fsdp's counting allocator
  // (include/fsdp/util/memory_counter.h): the most bytes alive at once in the process during
  // the step (parameters and optimizer state included; what fsdp-estimate's total_bytes
  // predicts), and the bytes autograd holds for backward at the end of the step's first
  // forward (allocated by the compute thread during forward and still alive, minus the
  // parameters gathered and communication buffers still held).
  int64_t peak_alloc_bytes = 0;
  int64_t activation_bytes = 0;
};

struct StepRecord {
  int64_t step = 0;
  double loss = 0;
  double grad_norm = 0;
  double tokens_per_s = 0;
  double step_s = 0;
  double exposed_comm_s = 0;  // rank 0's time blocked on FSDP communication in the step
  std::vector<RankStepStats> ranks;
  double lr = 0;                   // the learning rate the step took
  std::optional<double> val_loss;  // held-out loss after the step, when evaluated
  // Steps skipped so far without an update: non-finite ones (--skip-nonfinite) and, under fp16,
  // those whose gradients overflowed at the loss scale.
  int64_t skipped_steps = 0;
  std::optional<double> loss_scale;  // fp16: the scale this step's loss was multiplied by
  int64_t units = 0;                 // FSDP units, the root included (0 under --no-fsdp)
};

struct TrainSummary {
  std::vector<StepRecord> steps;
  double unigram_entropy =
      0;  // of the training text, in nats: the loss a model without context reaches
};

// Trains on this rank of group (group == nullptr means the --no-fsdp reference). Collective:
// every rank of group calls it with the same options. Rank 0 prints progress and writes the
// metrics file. With resume_dir, training continues at the checkpoint's step up to `steps`
// (the total), and the losses and parameters are those of an uninterrupted run: bit for bit at
// the same world size, to float rounding across world sizes (batches depend only on the seed
// and the step). export_path also gets a config.json beside it, so that the directory loads
// with the model's transformers class (GPT2LMHeadModel, LlamaForCausalLM).from_pretrained.
TrainSummary train(const TrainerOptions& options, const std::shared_ptr<ProcessGroup>& group);

// Validates options that need no data (positive sizes, a known model, the global batch
// divisible by world). Throws naming the flag and its value.
void validate(const TrainerOptions& options, int world);

// The model --model names, with TrainerOptions::vocab_size's override applied.
std::shared_ptr<const models::ModelSpec> model_spec_of(const TrainerOptions& options);

// The dtype a --param-dtype / --reduce-dtype value names (fp32, bf16, fp16); nullopt for "".
// Throws naming flag and value otherwise.
// --wrap-policy's value: nullopt for "block", N for "min-params:N" (N >= 1). Throws naming the
// flag and the value otherwise.
std::optional<int64_t> parse_wrap_policy(const std::string& value);
// --all-gather's value: nullopt for "fp", the block size for "int8" (256) or "int8:BLOCK"
// (BLOCK >= 1). Throws naming the flag and the value otherwise.
std::optional<int64_t> parse_all_gather(const std::string& value);

std::optional<at::ScalarType> dtype_flag(const std::string& flag, const std::string& value);

}  // namespace fsdp::train
