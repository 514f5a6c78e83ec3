// The tiny GPT-2 on the embedded corpus as a TrainCase, with the sharding options the tests
// vary. Global batch 12 x 16 tokens (divisible by W = 1..4), 10 AdamW steps.
#pragma once

#include "support/harness.h"

#include <models/gpt2/gpt2.h>

#include <optional>

namespace fsdp::test {

struct GptCaseOptions {
  std::optional<ReshardAfterForward> reshard_after_forward;  // for the blocks
  int accumulation = 1;
  // Build with the deferred, block-by-block construction that shards each block as it is made.
  bool deferred = true;
  int prefetch = 1;  // implicit prefetch depth (0: off)
  MixedPrecisionPolicy mp_policy;
  ShardPlacementFn shard_placement_fn;  // for every unit, root included (null: Shard(0))
  // The head (and so the tied table) a unit of its own with reshard_after_forward false, the
  // lookup reading the table's shards (fsdp-train --head-unit).
  bool head_unit = false;
};

TrainCase gpt_case(const GptCaseOptions& opt = {});

// Bytes autograd keeps from a forward of GPT-2 `config` (one process, random tokens of a
// [batch, seq] batch) until its backward, counted by the counting allocator.
int64_t gpt2_bytes_kept_for_backward(const models::GPT2Config& config, int64_t batch, int64_t seq,
                                     bool activation_checkpoint);

}  // namespace fsdp::test
