// Memory check of a local launch: process footprint plus the estimator's per-rank peak, times
// the local ranks, against MemAvailable. The estimate is the one fsdp-estimate prints for the
// same flags (include/fsdp/memory_estimate.h), within a few percent of measured peaks.
#include <fsdp_train/machine_fit.h>

#include <common/model_flags.h>

#include <fsdp/memory_estimate.h>
#include <fsdp/models/model.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <string>

namespace fsdp::train {
namespace {

std::string gib(int64_t bytes) {
  std::ostringstream out;
  out.precision(3);
  out << static_cast<double>(bytes) / (int64_t{1} << 30) << " GiB";
  return out.str();
}

}  // namespace

int64_t local_ranks_bytes(const JobConfig& o, const models::ModelSpec& spec, int world,
                          int local_ranks) {
  // The prediction fsdp-estimate makes for the same settings (tools/common/model_flags.h).
  tools::ModelFlags f{o, world, at::kFloat, o.parallelism.param_dtype != at::kFloat};
  const int64_t micro_batch = tools::checked_micro_batch(f, spec);
  const MemoryEstimateOptions options = tools::estimate_options(f);
  const ModelMemorySpec memory =
      tools::memory_spec_for(f, spec, micro_batch, tools::compute_dtype(f));
  int64_t rank_bytes = estimate_memory(memory, options).total_bytes;
  if (options.strategy() == ShardingStrategy::kWholeTensor) {
    // Built whole before it is partitioned: every rank holds the full fp32 model first.
    rank_bytes = std::max(rank_bytes, spec.num_parameters() * int64_t{4});
  }
  return int64_t{local_ranks} * (kProcessFootprintBytes + rank_bytes);
}

int64_t available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return -1;
}

void check_ranks_fit_memory(const JobConfig& o, const models::ModelSpec& spec, int world,
                            int local_ranks) {
  const int64_t available = available_memory_bytes();
  if (available < 0) return;  // not Linux: nothing to compare with
  int64_t needed = 0;
  try {
    needed = local_ranks_bytes(o, spec, world, local_ranks);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "--global-batch ", o.training.global_batch, " and --seq-len ",
                o.training.seq_len, " on ", world, " ranks: ", e.what_without_backtrace());
  }
  TORCH_CHECK(needed <= available, "--nproc ", local_ranks, ": ", local_ranks,
              " ranks of this run need about ", gib(needed), " (each ", gib(kProcessFootprintBytes),
              " of process plus ", gib(needed / local_ranks - kProcessFootprintBytes),
              " of tensors, as fsdp-estimate predicts), but this machine has ", gib(available),
              " available; use fewer ranks, a smaller --global-batch or --model, or more machines");
}

}  // namespace fsdp::train
