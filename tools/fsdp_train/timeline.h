// --trace DIR: each rank's timeline of compute and communication, written as a Chrome trace
// (DIR/rank<N>.json), with a counter track of the rank's memory.
#pragma once

#include <fsdp/runtime/observer.h>
#include <fsdp/util/trace.h>

#include <string>

namespace fsdp::train {

// Adds the memory counter track to monitor's tracer: at every traced event and every change of
// its stats' memory, the bytes of the runtime's categories (unsharded parameters and gradients,
// communication buffers) and of every live CPU tensor of the process. monitor must outlive the
// tracer's use.
void trace_memory(RankMonitor& monitor);

// Writes tracer's events to trace_dir/rank<rank>.json, creating trace_dir; with printing, says
// where. Does nothing when trace_dir is empty. Throws naming --trace when the directory cannot
// be created.
void write_timeline(const Tracer& tracer, const std::string& trace_dir, int rank, bool printing);

}  // namespace fsdp::train
