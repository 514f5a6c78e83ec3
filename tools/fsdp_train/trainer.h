// The training loop of fsdp-train: any registered model (models/model.h) on text as bytes or
// tokens (sources.h), sharded with fully_shard along the model's shard plan (one unit per
// transformer block plus the root) or, with no_fsdp, plain single-process LibTorch on the same
// global batch, which is the reference every sharded run must reproduce.
#pragma once

#include <fsdp/comm/process_group.h>
#include <train/job_config.h>

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::train {

// --dump-batches (DebugConfig::dump_batches_path): rank 0 writes every batch trained on, for
// reference runners (bench/reference/) that must train on exactly our tokens. The file, all
// integers little-endian int64:
//   header: 8 bytes "FSDPBAT1", B, T, K: B sequences of T tokens per micro-batch over all
//     ranks, K micro-batches (backward passes) per optimizer step;
//   then per step, K records: step (1-based, as in --metrics), micro-batch (0..K-1), B*T
//     inputs (row-major [B, T]), B*T targets (inputs shifted left by one token; on
//     fine-tuning data the labels shifted left by one, -100 where masked).
// Rank r trains on rows [r*B/W, (r+1)*B/W) of each record, and the step's loss is the mean
// of its K micro-batch losses; on fine-tuning data, the mean over the step's trained targets
// (those not -100) of all K records: Hugging Face's `model(input_ids, labels=labels).loss` of
// input_ids = inputs with one more token and labels = -100 followed by the targets.

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
  double tokens_per_s = 0;  // on fine-tuning data, trained (unmasked) targets per second
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
TrainSummary train(const JobConfig& job, const std::shared_ptr<ProcessGroup>& group);

}  // namespace fsdp::train
