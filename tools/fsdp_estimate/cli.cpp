// fsdp-estimate: predicts one rank's memory for an fsdp-train run, without running it.
//
//   fsdp-estimate --model small --world-size 4 --strategy full_shard --global-batch 8 --seq-len 128
//
// Prints one JSON object: the run's settings and the estimate under the names fsdp-train's
// --metrics uses (param_bytes, grad_bytes, optim_bytes, peak_unsharded_bytes), plus
// activation_bytes, comm_buffer_bytes, total_bytes and the phase of the step where the total
// peaks. See include/fsdp/memory_estimate.h for the definitions.
#include "fsdp_estimate/cli.h"

#include <common/model_flags.h>
#include <common/torch_program.h>
#include <fsdp/memory_estimate.h>
#include <fsdp/models/model.h>

#include <c10/util/Exception.h>

#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

namespace fsdp::tools {
namespace {

class EstimateCli : public TorchProgramCli {
 public:
  const char* name() const override { return "fsdp-estimate"; }
  const char* description() const override {
    return "fsdp-estimate: predict one rank's memory for an FSDP training step";
  }

  void add_flags(CLI::App& app) override {
    settings_ = std::make_unique<ConfigFlags>(app);
    add_prediction_flags(*settings_, f_);
    app.add_flag("--pretty", pretty_, "Indent the JSON");
    app.add_flag("--timeline", timeline_, "Add the most bytes live in each phase of the step");
  }
  ConfigFlags* config_flags() override { return settings_.get(); }

  // Every flag, alone and together, by computing the estimate (arithmetic only).
  void check(const CLI::App& app) override {
    f_.param_dtype_given = f_.param_dtype_given || app.count("--param-dtype") > 0;
    spec_ = sized_spec(f_);
    micro_batch_ = checked_micro_batch(f_, *spec_);  // sequences per pass
    const MemoryEstimateOptions options = estimate_options(f_);
    const ModelMemorySpec memory = memory_spec_for(f_, *spec_, micro_batch_, compute_dtype(f_));
    estimate_ = estimate_memory(memory, options);
  }

  int run(const CLI::App&, const std::vector<std::string>&) override {
    nlohmann::json out = nlohmann::json::parse(estimate_->to_json());
    out["settings"] = settings_json(f_, *spec_, micro_batch_);
    if (timeline_) {
      out["timeline"] = nlohmann::json::array();
      for (const auto& [phase, bytes] : estimate_->timeline)
        out["timeline"].push_back({{"phase", phase}, {"bytes", bytes}});
    }
    std::cout << out.dump(pretty_ ? 2 : -1) << '\n';
    return 0;
  }

 private:
  ModelFlags f_;
  std::unique_ptr<ConfigFlags> settings_;
  bool pretty_ = false, timeline_ = false;
  std::shared_ptr<const models::ModelSpec> spec_;
  int64_t micro_batch_ = 0;
  std::optional<MemoryEstimate> estimate_;
};

}  // namespace

std::unique_ptr<ProgramCli> make_estimate_cli() { return std::make_unique<EstimateCli>(); }

}  // namespace fsdp::tools
