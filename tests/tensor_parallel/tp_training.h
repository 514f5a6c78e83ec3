// Training under tensor parallelism against one process, for the tensor- and sequence-parallel
// suites: llama-tiny (with Qwen3's q/k norms for kQwen3) or GPT-2 tiny trained 5 AdamW steps with
// clipping in one process and on a dp x tp mesh of threads, each block split by the family's plan
// and sharded over dp as it is built, the root's plan applied, the root sharded last.
#pragma once

#include "support/harness.h"

#include <fsdp/comm/process_group.h>

#include <functional>
#include <memory>
#include <string>

namespace fsdp::test {

// kQwen3: llama-tiny with Qwen3's per-head q/k norms (qk_norm), whose weights ReplicateParallel
// keeps whole and whose gradients it sums over tp.
enum class Family { kLlama, kQwen3, kGpt2 };

struct TpRun {
  Family family = Family::kLlama;
  int dp = 1;
  int tp = 2;
  bool activation_checkpoint = false;
  bool sequence_parallel = false;
};

// Trains run and the one-process reference on the same batches and expects every rank's losses
// and gradient norms within 1e-5 (relative) of the reference's at every step and every parameter
// slice (its tensor-parallel slice, then FSDP's rows) within 1e-5 of the reference's.
void expect_matches_reference(const TpRun& run);

// The error that ends 2 ranks of threads running forward(group) under a 1.5 s collective
// timeout, where rank 1 returns at once (so rank 0's first collective cannot complete); "" if
// none does.
std::string error_when_rank_1_is_gone(
    const std::function<void(const std::shared_ptr<ProcessGroup>&)>& forward);

}  // namespace fsdp::test
