// fsdp-comm-bench: times the collectives FSDP uses over a range of message sizes, like
// nccl-tests, on the same process groups fsdp-train uses. With --nproc N (default 2) it launches
// N local ranks of itself; under torchrun, Slurm or mpirun each process is one rank (over MPI by
// default under mpirun). Rank 0 prints the
// table and, with --output, writes the measurements and an alpha-beta fit per collective as
// JSON (a link's latency and inverse bandwidth, for planning).
#include "fsdp_comm_bench/cli.h"

#include "fsdp_comm_bench/bench.h"

#include <common/backend_flags.h>
#include <common/cli_checks.h>
#include <common/launcher.h>
#include <common/torch_program.h>
#include <fsdp/comm/rendezvous.h>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace fsdp::tools {
namespace {

struct Flags {
  int nproc = 2;
  std::string backend = "auto";
  std::vector<std::string> collectives = {"all_gather", "reduce_scatter", "reduce_scatter_c10d",
                                          "all_reduce", "broadcast",      "reduce"};
  std::string min_bytes = "1K", max_bytes = "256M";
  std::string dtype = "fp32";
  std::string output;
  double timeout_s = 300;
  BenchOptions bench;
};

// "4096", "4K", "256M", "1G" (powers of 1024) in bytes; at most kMaxBytes.
constexpr int64_t kMaxBytes = 64LL << 30;

int64_t parse_bytes(const std::string& text, const char* flag) {
  size_t used = 0;
  long long value = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string suffix = text.substr(used);
  const int shift = suffix.empty()  ? 0
                    : suffix == "K" ? 10
                    : suffix == "M" ? 20
                    : suffix == "G" ? 30
                                    : -1;
  TORCH_CHECK(used > 0 && shift >= 0 && value > 0, flag, ": '", text,
              "' is not a positive size in bytes (e.g. 4096, 64K, 256M, 1G)");
  TORCH_CHECK(value <= (kMaxBytes >> shift), flag, ": '", text,
              "' is more than the 64G a benchmark buffer may take");
  return static_cast<int64_t>(value) << shift;
}

at::ScalarType parse_dtype(const std::string& name) {
  if (name == "fp32") return at::kFloat;
  if (name == "bf16") return at::kBFloat16;
  if (name == "fp16") return at::kHalf;
  TORCH_CHECK(false, "--dtype: '", name, "' is not one of fp32, bf16, fp16");
}

void add_flags_to(CLI::App& app, Flags& f) {
  app.add_option("--nproc", f.nproc, "Local ranks to launch (not under torchrun, Slurm or mpirun)")
      ->check(integer_at_least(1, 1024))
      ->capture_default_str();
  add_backend_flag(app, f.backend);
  app.add_option("--collectives", f.collectives,
                 "Which collectives: all_gather, reduce_scatter (ours, a ring), "
                 "reduce_scatter_c10d (c10d gloo's: all-reduce, then this rank's chunk), "
                 "all_reduce, broadcast, reduce (to rank 0)")
      ->delimiter(',')
      ->check(CLI::IsMember({"all_gather", "reduce_scatter", "reduce_scatter_c10d", "all_reduce",
                             "broadcast", "reduce"}))
      ->capture_default_str();
  app.add_option("--min-bytes", f.min_bytes, "Smallest message (nccl-tests' size; K, M, G)")
      ->capture_default_str();
  app.add_option("--max-bytes", f.max_bytes, "Largest message")->capture_default_str();
  app.add_option("--step-factor", f.bench.step_factor, "Each size is the previous times this")
      ->check(integer_at_least(2, 1 << 20))
      ->capture_default_str();
  app.add_option("--iters", f.bench.iters, "Timed calls per size, at most (see --time-budget-s)")
      ->check(integer_at_least(1, 1000000))
      ->capture_default_str();
  app.add_option("--warmup", f.bench.warmup_iters, "Untimed calls per size first")
      ->check(integer_at_least(0, 1000000))
      ->capture_default_str();
  app.add_option("--time-budget-s", f.bench.time_budget_s,
                 "Fewer timed calls where a size would take longer than this")
      ->check(finite_in(0, 1e6, /*open_min=*/true))
      ->capture_default_str();
  app.add_option("--dtype", f.dtype, "Element type: fp32, bf16 or fp16")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}))
      ->capture_default_str();
  app.add_option("--output", f.output, "Write the measurements and the alpha-beta fit as JSON")
      ->check(output_file());
  app.add_option("--timeout-s", f.timeout_s, "Collective and rendezvous timeout in seconds")
      ->check(finite_in(0, 1e7, /*open_min=*/true))
      ->capture_default_str();
}

void finish_options(Flags& f) {
  f.bench.min_bytes = parse_bytes(f.min_bytes, "--min-bytes");
  f.bench.max_bytes = parse_bytes(f.max_bytes, "--max-bytes");
  TORCH_CHECK(f.bench.max_bytes >= f.bench.min_bytes, "--max-bytes ", f.max_bytes,
              " is below --min-bytes ", f.min_bytes);
  f.bench.dtype = parse_dtype(f.dtype);
  for (const auto& name : f.collectives) {
    f.bench.collectives.push_back(collective_from_name(name));
  }
}

int run_rank(const Flags& f) {
  const fsdp::LaunchEnv env = fsdp::launch_env_from_environment();
  at::set_num_threads(1);  // the collectives run on the transport's threads
  fsdp::ProcessGroupOptions options;
  options.backend = f.backend == "auto" ? fsdp::default_backend(env) : f.backend;
  options.timeout = std::chrono::milliseconds(static_cast<int64_t>(f.timeout_s * 1000));
  auto group = fsdp::init_process_group(env, options);
  const auto results = run_bench(*group, f.bench);
  if (group->rank() != 0) return 0;
  std::fputs(format_table(results, group->size()).c_str(), stdout);
  const nlohmann::json fit = fit_alpha_beta(results);
  std::printf("# alpha-beta fit (time = alpha + beta * size):\n");
  for (const auto& [name, v] : fit.items()) {
    if (v["points"].get<int>() < 2) {
      std::printf("#   %-20s one size only: no fit\n", name.c_str());
      continue;
    }
    std::printf("#   %-20s alpha %.1f us, beta %.3f ns/B (%.3f GB/s), max error %.0f%%\n",
                name.c_str(), v["alpha_s"].get<double>() * 1e6,
                v["beta_s_per_byte"].get<double>() * 1e9,
                1e-9 / std::max(v["beta_s_per_byte"].get<double>(), 1e-30),
                v["max_rel_error"].get<double>() * 100);
  }
  if (!f.output.empty()) {
    nlohmann::json out = {{"backend", group->backend_name()},
                          {"world_size", group->size()},
                          {"dtype", f.dtype},
                          {"fit", fit},
                          {"results", nlohmann::json::array()}};
    for (const auto& m : results) {
      out["results"].push_back({{"collective", collective_name(m.collective)},
                                {"size_bytes", m.size_bytes},
                                {"iters", m.iters},
                                {"time_s", m.time_s},
                                {"algbw_gbs", m.algbw_gbs},
                                {"busbw_gbs", m.busbw_gbs}});
    }
    std::ofstream(f.output) << out.dump(2) << "\n";
  }
  return 0;
}

class CommBenchCli : public TorchProgramCli {
 public:
  const char* name() const override { return "fsdp-comm-bench"; }
  const char* description() const override {
    return "fsdp-comm-bench: collective latency and bandwidth, like nccl-tests";
  }
  void add_flags(CLI::App& app) override { add_flags_to(app, f_); }

  void check(const CLI::App& app) override {
    finish_options(f_);
    as_rank_ = app.count("--nproc") == 0 && launched_by_a_launcher();
    if (!as_rank_) check_backend_launches_locally(f_.backend, name());
  }

  int run(const CLI::App&, const std::vector<std::string>& args) override {
    if (as_rank_) return run_rank(f_);
    return launch_local_ranks(f_.nproc, strip_flag(args, "--nproc"));
  }

 private:
  Flags f_;
  bool as_rank_ = false;  // started by torchrun, srun or mpirun: this process is one rank
};

}  // namespace

std::unique_ptr<ProgramCli> make_comm_bench_cli() { return std::make_unique<CommBenchCli>(); }

}  // namespace fsdp::tools
