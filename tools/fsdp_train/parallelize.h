// A rank's mesh, model and optimizer: the mesh from --strategy, the model built and sharded
// into FSDP units (or left whole for the --no-fsdp reference), AdamW and fp16's loss scaler.
#pragma once

#include <fsdp_train/run.h>

namespace fsdp::train {

// Fills run's device, mesh, built, model, root, units, placement, tracer, params, optimizer and
// scaler from run.o and run.spec. Collective under FSDP: every rank of run.group calls it.
void parallelize(Run& run);

}  // namespace fsdp::train
