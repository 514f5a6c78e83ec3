// fsdp-estimate: predicts one rank's memory for an fsdp-train run, without running it.
//
//   fsdp-estimate --model small --world-size 4 --strategy full_shard --global-batch 8 --seq-len 128
//
// Prints one JSON object: the run's settings and the estimate under the names fsdp-train's
// --metrics uses (param_bytes, grad_bytes, optim_bytes, peak_unsharded_bytes), plus
// activation_bytes, comm_buffer_bytes, total_bytes and the phase of the step where the total
// peaks. See include/fsdp/memory_estimate.h for the definitions.
#include <c10/util/Exception.h>
#include <fsdp/memory_estimate.h>
#include <models/model.h>

#include <common/model_flags.h>
#include <common/report_errors.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

namespace {

struct Flags : fsdp::tools::ModelFlags {
  bool pretty = false, timeline = false;
};

void add_flags(CLI::App& app, Flags& f) {
  fsdp::tools::add_size_flags(app, f);
  fsdp::tools::add_mode_flags(app, f);
  app.add_flag("--pretty", f.pretty, "Indent the JSON");
  app.add_flag("--timeline", f.timeline, "Add the most bytes live in each phase of the step");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fsdp-estimate: predict one rank's memory for an FSDP training step"};
  Flags f;
  add_flags(app, f);
  CLI11_PARSE(app, argc, argv);

  return fsdp::tools::run_reporting_errors("fsdp-estimate", [&]() -> int {
    const auto spec = fsdp::tools::sized_spec(f);
    const int64_t micro_batch = fsdp::tools::checked_micro_batch(f, *spec);  // sequences per pass
    const fsdp::MemoryEstimateOptions options = fsdp::tools::estimate_options(f);
    const at::ScalarType compute =
        f.no_fsdp ? options.master_dtype() : options.param_dtype().value_or(options.master_dtype());
    const fsdp::ModelMemorySpec memory =
        fsdp::tools::memory_spec_for(f, *spec, micro_batch, compute, f.activation_checkpoint);
    const fsdp::MemoryEstimate e = fsdp::estimate_memory(memory, options);

    nlohmann::json out = nlohmann::json::parse(e.to_json());
    out["settings"] = fsdp::tools::settings_json(f, *spec, micro_batch);
    if (f.timeline) {
      out["timeline"] = nlohmann::json::array();
      for (const auto& [phase, bytes] : e.timeline)
        out["timeline"].push_back({{"phase", phase}, {"bytes", bytes}});
    }
    std::cout << out.dump(f.pretty ? 2 : -1) << '\n';
    return 0;
  });
}
