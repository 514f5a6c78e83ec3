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

}  // namespace fsdp::train
