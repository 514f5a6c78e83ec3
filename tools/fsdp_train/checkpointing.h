// The run's checkpoints: --init-from and --resume at the start, --save-every and the final
// --save during and after training, with what a checkpoint records about the run (settings,
// data position, skipped steps) and the checks that a resume continues the run it names.
#pragma once

#include <fsdp/train/data_loader.h>
#include <fsdp_train/run.h>

#include <cstdint>

namespace fsdp::train {

// --init-from, then --resume (which sets run.first_step and moves loader there, and restores
// fp16's gradient scaler and the count of skipped steps). Collective. Throws when the checkpoint
// was trained on other data or with another learning-rate schedule, or is past --steps.
void load_initial_state(Run& run, DataLoader& loader);

// --save-every: saves after steps_done steps when they are a multiple of it. Collective. The
// loader must stand at steps_done.
void save_periodically(Run& run, const DataLoader& loader, int64_t steps_done);

// --save: the final state, unless --save-every just saved it (also when no step ran: --steps 0,
// or a resume at the last step). Collective. The loader must stand at --steps.
void save_final(Run& run, const DataLoader& loader);

}  // namespace fsdp::train
