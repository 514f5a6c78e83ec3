// The measurements behind fsdp-comm-bench: each collective timed over a range of message
// sizes on a process group, with nccl-tests' definitions of the reported bandwidths, and a
// alpha-beta model per collective, fitted to relative error, that a planner reads.
//
// Sizes are nccl-tests' "size": the bytes of the larger buffer of the operation (all-gather:
// the gathered output; reduce-scatter: the full input; all-reduce and broadcast: the tensor).
// algbw = size / time. busbw rescales algbw to what each link carries in a ring, so that the
// numbers of different collectives and world sizes compare: all-gather and reduce-scatter
// (W-1)/W, all-reduce 2(W-1)/W, broadcast 1.
#pragma once

#include <fsdp/comm/process_group.h>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace fsdp::tools {

// The collectives measured. kReduceScatterViaAllReduce is c10d's gloo reduce-scatter: an
// all-reduce of the whole input, then a copy of this rank's chunk; it runs next to our ring
// reduce-scatter so the two compare in one run.
enum class Collective {
  kAllGather,
  kReduceScatter,
  kReduceScatterViaAllReduce,
  kAllReduce,
  kBroadcast,
  kReduce
};

std::string collective_name(Collective c);
// Parses one of collective_name()'s values; throws naming the value and the choices.
Collective collective_from_name(const std::string& name);
// The factor busbw = algbw * factor for world size w.
double bus_factor(Collective c, int world_size);

struct BenchOptions {
  std::vector<Collective> collectives;
  int64_t min_bytes = 1024;
  int64_t max_bytes = 256LL << 20;
  int64_t step_factor = 4;  // sizes min, min*f, min*f^2, ... up to max
  int warmup_iters = 2;
  int iters = 10;              // at most; fewer where a size would take longer than time_budget_s
  double time_budget_s = 2.0;  // per size and collective
  at::ScalarType dtype = at::kFloat;
};

struct Measurement {
  Collective collective;
  int64_t size_bytes = 0;  // nccl-tests' size (see above)
  int iters = 0;
  double time_s = 0;     // the slowest rank's median time per call
  double algbw_gbs = 0;  // GB/s, 1e9 bytes
  double busbw_gbs = 0;
};

// Runs every collective at every size on group; collective over the group (every rank calls it
// with the same options) and returns the same measurements on every rank.
std::vector<Measurement> run_bench(ProcessGroup& group, const BenchOptions& options);

// Per collective: the fit time = alpha + beta * size over its measurements that minimizes the
// sum of squared relative errors (every size counts alike), as
// {"alpha_s": ..., "beta_s_per_byte": ..., "points": n, "max_rel_error": ...}.
nlohmann::json fit_alpha_beta(const std::vector<Measurement>& results);

// nccl-tests' table: one line per size and collective.
std::string format_table(const std::vector<Measurement>& results, int world_size);

}  // namespace fsdp::tools
