// Will the ranks of a local launch fit this machine? Checked before any rank starts, so that
// `--nproc 500` on a small machine is refused at once instead of swapping or being killed
// half-way through start-up.
#pragma once

#include <train/job_config.h>

#include <cstdint>

namespace fsdp::models {
class ModelSpec;
}  // namespace fsdp::models

namespace fsdp::train {

// Resident memory of one fsdp-train process beyond its tensors: LibTorch's code and data, the
// allocator's caches and the communication threads, as measured by bench/fsdp2_side_by_side.sh
// (464 MiB per rank, bench/RESULTS.md).
constexpr int64_t kProcessFootprintBytes = int64_t{464} << 20;

// The bytes local_ranks ranks of this run need on this machine: each its process footprint
// plus fsdp-estimate's prediction of its peak tensor bytes. spec: the job's model
// (model_spec_of).
int64_t local_ranks_bytes(const JobConfig& options, const models::ModelSpec& spec, int world,
                          int local_ranks);

// The kernel's estimate of memory available to new processes (MemAvailable in /proc/meminfo),
// in bytes; -1 where it cannot be read.
int64_t available_memory_bytes();

// Throws, naming --nproc, the bytes needed and the bytes available, when local_ranks ranks
// of this run cannot fit the memory available now. Call after validate(), with the spec it
// returns.
void check_ranks_fit_memory(const JobConfig& options, const models::ModelSpec& spec, int world,
                            int local_ranks);

}  // namespace fsdp::train
