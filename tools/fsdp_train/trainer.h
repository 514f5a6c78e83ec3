// The training loop of fsdp-train: any registered model (fsdp/models/model.h) on text as bytes or
// tokens (sources.h), sharded with fully_shard along the model's shard plan (one unit per
// transformer block plus the root) or, with no_fsdp, plain single-process LibTorch on the same
// global batch, which is the reference every sharded run must reproduce.
#pragma once

#include <fsdp/comm/process_group.h>
#include <fsdp/train/step_record.h>
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

// What train() returns. It holds the last step's record, not every step's: a record is about a
// kilobyte at two ranks and grows with the world size, so a history would grow the process
// for as long as it trains (a 20,000-step soak found 20 MB a rank). Every step's record is in
// the metrics file (--metrics) as it happens.
struct TrainSummary {
  std::optional<StepRecord> last_step;  // none when the run trained no step (resumed at the end)
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
