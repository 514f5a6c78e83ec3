// What a step measures of itself for --metrics (RankStepStats in trainer.h): its time, the bytes
// the rank holds by kind, the bytes its collectives moved, its process's memory and writes, and
// the activations its first forward left for backward.
#pragma once

#include <common/kept_host_pages.h>
#include <fsdp/comm/process_group.h>
#include <fsdp/util/stats.h>
#include <fsdp_train/run.h>
#include <fsdp_train/trainer.h>

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <vector>

namespace fsdp::train {

// What a step records around its forward and backward, for RankStepStats.
struct StepProbe {
  using Clock = std::chrono::steady_clock;
  Clock::time_point start;
  int64_t written_at_start = 0;
  int64_t live_before_forward = 0;
  MemorySnapshot held_before_forward;
  int64_t activation_bytes = 0;
  int64_t grad_bytes = 0;
  tools::KeptPages host_pages;  // what the step's end kept and gave back (Run::host_pages)

  // Seconds from the start of the step to now.
  double seconds_so_far() const;
};

// Starts the step's clock and resets the mesh's per-step counters and peaks.
StepProbe begin_step(Run& run);

// Taken just before the first forward, after the batch is built and dumped.
void probe_before_forward(const Run& run, StepProbe& probe);

// The bytes autograd holds for backward since probe_before_forward, in bytes.
int64_t activation_bytes_since(const Run& run, const StepProbe& probe);

// The bytes of the gradients params hold.
int64_t grad_bytes(const std::vector<at::Tensor>& params);

// This rank's numbers for the step, at its end.
RankStepStats measure_rank(const Run& run, const StepProbe& probe);

// Every rank's stats, gathered to every rank (one small all-gather of int64s per step).
// Collective over group; group == nullptr (the --no-fsdp reference) returns {mine}.
std::vector<RankStepStats> gather_stats(const RankStepStats& mine, ProcessGroup* group);

}  // namespace fsdp::train
