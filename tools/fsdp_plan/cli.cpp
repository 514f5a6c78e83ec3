// fsdp-plan: predicts an fsdp-train run's step time, exposed communication, tokens/s, MFU and
// peak memory per rank, before running it, from a hardware file.
//
//   fsdp-plan --hardware hw.json --world-size 4 --model small --global-batch 8 --seq-len 128
//   fsdp-plan --calibrate --output hw.json      # measure this machine
//   fsdp-plan --hardware hw.json --world-size 8 --model llama-8b --sweep --memory-budget 80G
//
// The model and mode flags are fsdp-train's and fsdp-estimate's (tools/common/model_flags.h).
// --json prints one object under fsdp-train's --metrics names (step_s, tokens_per_s,
// exposed_comm_s, ranks[].param_bytes ...) plus mfu, so a prediction and a measurement compare
// key by key. See include/fsdp/step_time_plan.h for the method.
#include "fsdp_plan/cli.h"

#include "fsdp_plan/calibrate.h"
#include "fsdp_plan/compute_spec.h"

#include <common/model_flags.h>
#include <common/torch_program.h>
#include <fsdp/step_time_plan.h>

#include <c10/util/Exception.h>

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

namespace fsdp::tools {
namespace {

struct Flags : ModelFlags {
  std::string hardware, output, memory_budget;
  bool json = false, pretty = false, calibrate = false, sweep = false;
};

void add_flags_to(CLI::App& app, ConfigFlags& settings, Flags& f) {
  add_prediction_flags(settings, f);
  settings
      .value("training", "--max-grad-norm", f.job.training.max_grad_norm,
             "As fsdp-train's: clipping costs a pass over the gradients and an all-reduce "
             "(inf: no clipping)")
      ->check(positive_or_inf())
      ->capture_default_str();
  app.add_option("--hardware", f.hardware,
                 "Hardware file (JSON): peak FLOP/s, achieved fractions, memory, links, "
                 "collective fits (bench/hardware/, or --calibrate's)")
      ->check(existing_file());
  app.add_flag("--json", f.json, "Print one JSON object (fsdp-train --metrics names, plus mfu)");
  app.add_flag("--pretty", f.pretty, "Indent the JSON");
  app.add_flag("--calibrate", f.calibrate,
               "Measure this machine (matmul, attention, bandwidth, AdamW, fsdp-comm-bench at "
               "2 and 4 ranks) and write a hardware file to --output");
  app.add_option("--output", f.output, "Where --calibrate writes the hardware file")
      ->check(output_file());
  CLI::Option* sweep =
      app.add_flag("--sweep", f.sweep,
                   "List strategies, hpZ group sizes and tensor-parallel sizes (--tp) that fit "
                   "--memory-budget, fastest first (--sequence-parallel: with it wherever tp > 1)");
  // A budget without --sweep would be silently ignored: the single plan reports fit against
  // the hardware file's memory.
  app.add_option("--memory-budget", f.memory_budget,
                 "Bytes per rank for --sweep (K, M, G: powers of 1024; default: the hardware "
                 "file's memory_bytes)")
      ->needs(sweep);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  TORCH_CHECK(in.good(), "cannot read hardware file '", path, "'");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

int64_t parse_bytes(const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string suffix = text.substr(used);
  const int shift = suffix.empty()  ? 0
                    : suffix == "K" ? 10
                    : suffix == "M" ? 20
                    : suffix == "G" ? 30
                                    : -1;
  TORCH_CHECK(used > 0 && shift >= 0 && std::isfinite(value) && value > 0 && value < 1e18,
              "--memory-budget: '", text, "' is not a positive size in bytes (e.g. 80G, 512M)");
  return static_cast<int64_t>(std::ldexp(value, shift));
}

// The plan of one configuration (the flags' strategy, hpZ and world size).
fsdp::StepTimePlan plan(Flags f, const fsdp::HardwareSpec& hw) {
  const auto spec = sized_spec(f);
  const int64_t micro_batch = checked_micro_batch(f, *spec);
  const fsdp::MemoryEstimateOptions memory = estimate_options(f);
  const at::ScalarType dtype = compute_dtype(f);
  const fsdp::ModelMemorySpec memory_spec = memory_spec_for(f, *spec, micro_batch, dtype);
  const train::ParallelismConfig& par = f.job.parallelism;
  const fsdp::ModelComputeSpec compute = compute_spec(*spec, micro_batch, f.job.training.seq_len,
                                                      dtype, par.tp, par.sequence_parallel);
  fsdp::StepTimeOptions options;
  options.memory(memory)
      .activation_checkpoint(f.job.model.activation_checkpoint)
      .clip_grad_norm(std::isfinite(f.job.training.max_grad_norm))
      .tensor_parallel(par.tp);
  return fsdp::plan_step_time(memory_spec, compute, options, hw);
}

// fsdp-train's --metrics names: every rank holds the same bytes, so each gets the estimate.
nlohmann::json plan_json(const fsdp::StepTimePlan& p, const Flags& f,
                         const fsdp::HardwareSpec& hw) {
  nlohmann::json ranks = nlohmann::json::array();
  const fsdp::MemoryEstimate& m = p.memory;
  for (int r = 0; r < f.world; ++r) {
    ranks.push_back({{"rank", r},
                     {"param_bytes", m.param_bytes},
                     {"grad_bytes", m.grad_bytes},
                     {"optim_bytes", m.optim_bytes},
                     {"peak_unsharded_bytes", m.peak_unsharded_bytes},
                     {"all_gather_bytes", m.all_gather_bytes},
                     {"reduce_scatter_bytes", m.reduce_scatter_bytes},
                     {"all_reduce_bytes", m.all_reduce_bytes},
                     {"tp_all_gather_calls", m.tensor_parallel.all_gather.calls},
                     {"tp_reduce_scatter_calls", m.tensor_parallel.reduce_scatter.calls},
                     {"tp_all_reduce_calls", m.tensor_parallel.all_reduce.calls},
                     {"peak_alloc_bytes", m.total_bytes},
                     {"activation_bytes", m.activation_bytes}});
  }
  const auto spec = sized_spec(f);
  return {
      {"step_s", p.step_s},
      {"tokens_per_s", p.tokens_per_s},
      {"exposed_comm_s", p.exposed_comm_s},
      {"mfu", p.mfu},
      {"compute_s", p.compute_s},
      {"comm_s", p.comm_s},
      {"optimizer_s", p.optimizer_s},
      {"tp_comm_s", p.tp_comm_s},
      {"model_flops_per_step", p.model_flops_per_step},
      {"fits", m.total_bytes <= hw.memory_bytes},
      {"hardware", hw.name},
      {"settings",
       settings_json(f, *spec, f.job.training.global_batch / f.world / f.job.training.grad_accum)},
      {"ranks", ranks}};
}

void print_plan(const fsdp::StepTimePlan& p, const Flags& f, const fsdp::HardwareSpec& hw) {
  const fsdp::MemoryEstimate& m = p.memory;
  const train::ParallelismConfig& par = f.job.parallelism;
  const std::string tp =
      par.tp > 1 ? " x tp " + std::to_string(par.tp) + (par.sequence_parallel ? " with SP" : "")
                 : "";
  std::printf("%s on %d rank(s) of %s, %s%s, prefetch %d\n", f.job.model.name.c_str(), f.world,
              hw.name.c_str(), par.no_fsdp ? "no FSDP" : to_string(par.strategy).c_str(),
              tp.c_str(), par.prefetch);
  std::printf("  step            %9.4f s  (%lld tokens)\n", p.step_s,
              static_cast<long long>(p.tokens_per_step));
  std::printf("  compute         %9.4f s  (optimizer and clipping %.4f s)\n", p.compute_s,
              p.optimizer_s);
  std::printf("  exposed comm    %9.4f s  of %.4f s of collectives\n", p.exposed_comm_s, p.comm_s);
  if (par.tp > 1)
    std::printf("  tp collectives  %9.4f s  (waited for inside the units' compute)\n", p.tp_comm_s);
  std::printf("  tokens/s        %9.0f     (%.0f per rank)\n", p.tokens_per_s,
              p.tokens_per_s / f.world);
  std::printf("  MFU             %9.1f %%\n", 100 * p.mfu);
  std::printf("  peak memory     %9.3f GiB per rank (%s), device %.3f GiB: %s\n",
              m.total_bytes / 1073741824.0, m.peak_phase.c_str(), hw.memory_bytes / 1073741824.0,
              m.total_bytes <= hw.memory_bytes ? "fits" : "does NOT fit");
}

// Whether the model splits over tp tensor-parallel ranks (its heads, key/value heads and layer
// widths divide), as its memory spec says by refusing.
bool splits_over(const Flags& f, int tp) {
  try {
    sized_spec(f)->memory_spec(1, f.job.training.seq_len, compute_dtype(f), false, tp, false);
    return true;
  } catch (const c10::Error&) {
    return false;
  }
}

// The flags with one configuration's parallelism.
Flags configuration(const Flags& f, ShardingStrategy strategy, int replicate, int raf, int tp) {
  Flags c = f;
  c.job.parallelism.strategy = strategy;
  c.job.parallelism.replicate = replicate;
  c.job.parallelism.reshard_after_forward = raf;
  c.job.parallelism.tp = tp;
  c.job.parallelism.sequence_parallel = tp > 1 && f.job.parallelism.sequence_parallel;
  return c;
}

// Every strategy (and hpZ group, HSDP replica count) at the flags' world size, FSDP alone.
std::vector<Flags> fsdp_configurations(const Flags& f) {
  std::vector<Flags> out;
  for (int replicate = 1; replicate <= f.world; ++replicate) {
    if (f.world % replicate != 0) continue;
    const int shard = f.world / replicate;
    const ShardingStrategy strategy =
        replicate == 1 ? ShardingStrategy::kFullShard : ShardingStrategy::kHybridShard;
    if (replicate < f.world) out.push_back(configuration(f, strategy, replicate, 1, 1));
    for (int n = 2; n < shard; ++n) {
      if (shard % n == 0) out.push_back(configuration(f, strategy, replicate, n, 1));
    }
  }
  out.push_back(configuration(f, ShardingStrategy::kShardGradOp, 1, 1, 1));
  out.push_back(configuration(f, ShardingStrategy::kNoShard, 1, 1, 1));
  return out;
}

// With each tensor-parallel size T that divides the world size, stays within a node (tp runs
// over the fastest link) and splits the model: full_shard (and its hpZ groups) and
// shard_grad_op over W / T.
std::vector<Flags> tensor_parallel_configurations(const Flags& f, const fsdp::HardwareSpec& hw) {
  std::vector<Flags> out;
  const int node = hw.cpu_cores > 0 ? f.world : hw.devices_per_node;
  for (int tp = 2; tp <= std::min(f.world, node); ++tp) {
    const bool sp_splits = !f.job.parallelism.sequence_parallel || f.job.training.seq_len % tp == 0;
    if (f.world % tp != 0 || !sp_splits || !splits_over(f, tp)) continue;
    const int data = f.world / tp;
    if (data > 1) out.push_back(configuration(f, ShardingStrategy::kFullShard, 1, 1, tp));
    for (int n = 2; n < data; ++n) {
      if (data % n == 0) out.push_back(configuration(f, ShardingStrategy::kFullShard, 1, n, tp));
    }
    out.push_back(configuration(f, ShardingStrategy::kShardGradOp, 1, 1, tp));
  }
  return out;
}

std::vector<Flags> sweep_configurations(const Flags& f, const fsdp::HardwareSpec& hw) {
  std::vector<Flags> out = fsdp_configurations(f);
  for (Flags& c : tensor_parallel_configurations(f, hw)) out.push_back(std::move(c));
  return out;
}

using Fitting = std::vector<std::pair<Flags, fsdp::StepTimePlan>>;

// Every configuration of the sweep that fits the budget, fastest first.
Fitting sweep(const Flags& f, const fsdp::HardwareSpec& hw) {
  const int64_t budget = f.memory_budget.empty() ? hw.memory_bytes : parse_bytes(f.memory_budget);
  Fitting fitting;
  for (const Flags& c : sweep_configurations(f, hw)) {
    // A batch that does not divide over a configuration's data-parallel ranks rules it out.
    const int data = c.world / c.job.parallelism.tp;
    if (c.job.training.global_batch % (int64_t(data) * c.job.training.grad_accum) != 0) continue;
    fsdp::StepTimePlan p = plan(c, hw);
    if (p.memory.total_bytes <= budget) fitting.emplace_back(c, p);
  }
  std::sort(fitting.begin(), fitting.end(),
            [](const auto& a, const auto& b) { return a.second.step_s < b.second.step_s; });
  return fitting;
}

void print_sweep(const Fitting& fitting, const Flags& f, const fsdp::HardwareSpec& hw) {
  if (f.json) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& [c, p] : fitting) out.push_back(plan_json(p, c, hw));
    std::cout << out.dump(f.pretty ? 2 : -1) << '\n';
    return;
  }
  const int64_t budget = f.memory_budget.empty() ? hw.memory_bytes : parse_bytes(f.memory_budget);
  std::printf("%s on %d rank(s) of %s: %zu configuration(s) fit %.3f GiB per rank\n",
              f.job.model.name.c_str(), f.world, hw.name.c_str(), fitting.size(),
              budget / 1073741824.0);
  std::printf("%-14s %9s %6s %4s %10s %12s %7s %11s\n", "strategy", "replicate", "hpZ", "tp",
              "step_s", "tokens/s", "MFU", "peak GiB");
  for (const auto& [c, p] : fitting) {
    const train::ParallelismConfig& par = c.job.parallelism;
    std::printf(
        "%-14s %9d %6s %4d %10.4f %12.0f %6.1f%% %11.3f\n", to_string(par.strategy).c_str(),
        par.replicate,
        par.reshard_after_forward > 1 ? std::to_string(par.reshard_after_forward).c_str() : "-",
        par.tp, p.step_s, p.tokens_per_s, 100 * p.mfu, p.memory.total_bytes / 1073741824.0);
  }
}

// The directory of this program, where fsdp-comm-bench is built too.
std::string program_dir(const char* argv0) {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  std::string path = n > 0 ? std::string(self, n) : std::string(argv0);
  const auto slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

int run_calibration(const Flags& f, const char* argv0) {
  CalibrateOptions options;
  options.comm_bench = program_dir(argv0) + "/fsdp-comm-bench";
  const nlohmann::json hw = calibrate(options);
  std::ofstream(f.output) << hw.dump(2) << '\n';
  std::printf("fsdp-plan: wrote %s\n", f.output.c_str());
  return 0;
}

// The hardware file's faults (not JSON, a field missing or out of range) name the flag too.
fsdp::HardwareSpec load_hardware(const std::string& path) {
  try {
    return fsdp::HardwareSpec::from_json(read_file(path), path);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "--hardware: ", e.what_without_backtrace());
  }
}

class PlanCli : public TorchProgramCli {
 public:
  const char* name() const override { return "fsdp-plan"; }
  const char* description() const override {
    return "fsdp-plan: predict step time, tokens/s, MFU and memory of an FSDP run";
  }
  void add_flags(CLI::App& app) override {
    settings_ = std::make_unique<ConfigFlags>(app);
    add_flags_to(app, *settings_, f_);
  }
  ConfigFlags* config_flags() override { return settings_.get(); }

  // Every flag, by computing the plan (or the sweep's plans): arithmetic only. --calibrate
  // measures the machine in run().
  void check(const CLI::App& app) override {
    f_.param_dtype_given = f_.param_dtype_given || app.count("--param-dtype") > 0;
    if (f_.calibrate) {
      TORCH_CHECK(!f_.output.empty(), "--calibrate needs --output FILE for the hardware file");
      return;
    }
    if (f_.job.parallelism.no_fsdp) f_.world = 1;
    TORCH_CHECK(!f_.hardware.empty(), "--hardware FILE is required (or --calibrate to make one)");
    hw_ = load_hardware(f_.hardware);
    if (f_.sweep) {
      fitting_ = sweep(f_, *hw_);
    } else {
      plan_ = plan(f_, *hw_);
    }
  }

  int run(const CLI::App&, const std::vector<std::string>&) override {
    if (f_.calibrate) return run_calibration(f_, name());
    if (f_.sweep) {
      print_sweep(fitting_, f_, *hw_);
    } else if (f_.json) {
      std::cout << plan_json(*plan_, f_, *hw_).dump(f_.pretty ? 2 : -1) << '\n';
    } else {
      print_plan(*plan_, f_, *hw_);
    }
    return 0;
  }

 private:
  Flags f_;
  std::unique_ptr<ConfigFlags> settings_;
  std::optional<fsdp::HardwareSpec> hw_;
  std::optional<fsdp::StepTimePlan> plan_;
  Fitting fitting_;
};

}  // namespace

std::unique_ptr<ProgramCli> make_plan_cli() { return std::make_unique<PlanCli>(); }

}  // namespace fsdp::tools
