// The numerics guard: what a step with a non-finite loss or gradient norm reports.
//
// The trainer's loss (averaged over ranks) and gradient norm (over every shard) are global, so
// every rank sees a non-finite step at once and calls describe_nonfinite together; only then
// does anything extra run (one pass over this rank's gradients and one small all-gather), so a
// healthy step pays nothing.
#pragma once

#include <fsdp/comm/process_group.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::train {

// One FSDP unit's name and its parameters as this rank holds them (the local shards, whose
// .grad() is what the reduce-scatter produced).
using UnitParams = std::pair<std::string, std::vector<at::Tensor>>;

// Collective over group (nullptr: one process). step is 0-based; units in backward order.
// Returns "step N: the loss is not finite on rank 1 (nan) ...; gradient norm nan; the first unit
// in backward order with a non-finite gradient is 'h.1' (on ranks 0, 1)".
std::string describe_nonfinite(int64_t step, const at::Tensor& local_loss, double grad_norm,
                               const std::vector<UnitParams>& units, ProcessGroup* group);

// FSDP_TRAIN_NAN_AT=<step>:<rank>[,...] (0-based step): whether this rank's loss is to be made
// NaN at step, to test the guard. Throws on a malformed value.
bool nan_injected_at(int64_t step, int rank);

// FSDP_TRAIN_OVERFLOW_AT=<step>:<rank>[,...]: whether this rank's gradient shards are to overflow
// at step (after backward), to test fp16's gradient scaler. Throws on a malformed value.
bool overflow_injected_at(int64_t step, int rank);

// Sets the first element of the first non-empty gradient among params to +inf, as an fp16
// gradient that overflowed would be.
void make_a_gradient_inf(const std::vector<at::Tensor>& params);

}  // namespace fsdp::train
