// Local multi-process launch, like `torchrun --nproc-per-node N`: the program starts N copies
// of itself with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT
// set, and supervises them.
#pragma once

#include <string>
#include <vector>

namespace fsdp::tools {

// Set in the environment of the ranks launch_local_ranks starts: such a process is a rank,
// whatever its settings say of launching (a --config file's [launch] nproc, read again by
// each rank, must not make the ranks launch ranks of their own).
inline constexpr const char* kLocalRankMarker = "FSDP_LOCAL_LAUNCH_RANK";
bool started_by_launch_local_ranks();

// Runs `/proc/self/exe args...` as ranks 0..nproc-1 and waits for all of them. If one fails,
// the others are stopped (SIGTERM, then SIGKILL after a grace period) and a message naming
// the rank and how it ended goes to stderr. Returns 0 when every rank exited 0, else the
// first failing rank's exit code (128 + signal for a signal).
int launch_local_ranks(int nproc, const std::vector<std::string>& args);

// args without the launcher's own flag (`--nproc N` or `--nproc=N`), for the children.
std::vector<std::string> strip_flag(const std::vector<std::string>& args, const std::string& flag);

}  // namespace fsdp::tools
