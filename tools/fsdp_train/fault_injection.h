// Faults the tests inject into a training run through environment variables: a rank killed or
// stalled at a step (restart and timeout tests), a NaN loss (the numerics guard) and an
// overflowing gradient (fp16's gradient scaler). Steps are 0-based; malformed values throw.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace fsdp::train {

// At the start of step, on this rank:
// - FSDP_TRAIN_KILL_AT=<step>:<rank>:<marker file>[,...]: kills the process with SIGKILL unless
//   the marker exists, creating it first, so a restarted job that runs the step again goes past;
// - FSDP_TRAIN_STALL_AT=<step>:<rank>: stops for ever, alive, issuing no further collective.
// Returns when neither names (step, rank).
void crash_or_stall_if_asked(int64_t step, int rank);

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
