// fsdp-train: the command-line front end. With --nproc N it launches N local ranks of itself;
// started by torchrun, srun or mpirun it is one rank (over MPI by default under mpirun, else
// gloo); with --no-fsdp it is the single-process reference. With none of these it launches 2
// local ranks.
#include "fsdp_train/cli.h"

#include <common/backend_flags.h>
#include <common/cli_checks.h>
#include <common/job_flags.h>
#include <common/launcher.h>
#include <common/torch_program.h>
#include <fsdp/comm/rendezvous.h>
#include <fsdp/data/corpus.h>
#include <fsdp/models/model.h>
#include <fsdp_train/job_checks.h>
#include <fsdp_train/machine_fit.h>
#include <fsdp_train/trainer.h>

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <thread>

namespace fsdp::tools {
namespace {

constexpr int kDefaultLocalRanks = 2;

// Ranks sharing a machine split its cores instead of each using all of them.
void set_intra_op_threads(int local_world) {
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  at::set_num_threads(static_cast<int>(std::max(1u, cores / static_cast<unsigned>(local_world))));
}

// --backend auto: nccl for a run on CUDA devices (the only backend that moves CUDA tensors),
// otherwise what the launch suggests (mpi under mpirun, else gloo).
std::string backend_for(const std::string& asked, const fsdp::LaunchEnv& env,
                        fsdp::train::DeviceKind device) {
  if (asked != "auto") return asked;
  if (device == fsdp::train::DeviceKind::kCuda) return "nccl";
  return fsdp::default_backend(env);
}

class TrainCli : public TorchProgramCli {
 public:
  const char* name() const override { return "fsdp-train"; }
  const char* description() const override {
    return "fsdp-train: train a transformer with fully sharded data parallelism on LibTorch";
  }
  void add_flags(CLI::App& app) override {
    settings_ = std::make_unique<ConfigFlags>(app);
    add_job_flags(*settings_, job_);
  }
  ConfigFlags* config_flags() override { return settings_.get(); }

  // How this process runs (one process, one rank of a launcher's job, or the launcher of
  // local ranks), and in the first and last case every flag against the others before any rank
  // starts. A rank of a launcher's job is checked by train() itself.
  void check(const CLI::App& app) override {
    take_model_from_init_dir(app);
    const bool nproc_given = job_.launch.nproc > 0 && !started_by_launch_local_ranks();
    if (job_.parallelism.no_fsdp) {
      TORCH_CHECK(!nproc_given, "--no-fsdp runs one process; drop --nproc ", job_.launch.nproc);
      mode_ = Mode::kSingleProcess;
      ranks_ = 1;
    } else if (started_by_launch_local_ranks() ||
               (!nproc_given && fsdp::launched_by_a_launcher())) {
      mode_ = Mode::kRankOfALaunch;
      return;
    } else {
      check_backend_launches_locally(job_.launch.backend, name());
      mode_ = Mode::kLocalRanks;
      ranks_ = nproc_given ? job_.launch.nproc : kDefaultLocalRanks;
      TORCH_CHECK(ranks_ >= 1, "--nproc must be at least 1, got ", ranks_);
    }
    // Report bad flags once, before starting any rank.
    const auto spec = fsdp::train::validate(job_, ranks_);
    fsdp::train::check_ranks_fit_memory(job_, *spec, ranks_, ranks_);
  }

  int run(const CLI::App&, const std::vector<std::string>& args) override {
    switch (mode_) {
      case Mode::kSingleProcess:
        set_intra_op_threads(1);
        fsdp::train::train(job_, nullptr);
        return 0;
      case Mode::kRankOfALaunch:
        return run_rank();
      case Mode::kLocalRanks:
        return launch_local_ranks(ranks_, strip_flag(args, "--nproc"));
    }
    return 1;
  }

 private:
  enum class Mode { kSingleProcess, kRankOfALaunch, kLocalRanks };

  // `--init-from DIR` of a Hugging Face model directory, without --model: the model is DIR's
  // (its config.json), and without --tokenizer the tokenizer.json beside the weights is used.
  void take_model_from_init_dir(const CLI::App& app) {
    const std::string& dir = job_.model.init_from;
    if (app.count("--model") > 0 || !fsdp::models::is_pretrained_dir(dir)) return;
    job_.model.name = dir;
    const std::string tokenizer = dir + "/tokenizer.json";
    struct stat st {};
    if (app.count("--tokenizer") == 0 && ::stat(tokenizer.c_str(), &st) == 0) {
      job_.data.tokenizer = tokenizer;
    }
  }

  // Launched by torchrun, Slurm's srun or Open MPI's mpirun: this process is one rank.
  int run_rank() {
    const fsdp::LaunchEnv env = fsdp::launch_env_from_environment();
    set_intra_op_threads(env.local_world_size);
    fsdp::ProcessGroupOptions pg_options;
    pg_options.backend = backend_for(job_.launch.backend, env, job_.parallelism.device);
    pg_options.timeout =
        std::chrono::milliseconds(static_cast<int64_t>(job_.launch.timeout_s * 1000));
    const std::string& trace_dir = job_.metrics.trace_dir;
    if (!trace_dir.empty()) {
      ::mkdir(trace_dir.c_str(), 0755);  // an error shows when the trace is written
      pg_options.flight_recorder_dir = trace_dir;
    }
    auto group = fsdp::init_process_group(env, pg_options);
    fsdp::train::train(job_, group);
    return 0;
  }

  fsdp::train::JobConfig job_;
  std::unique_ptr<ConfigFlags> settings_;
  Mode mode_ = Mode::kLocalRanks;
  int ranks_ = kDefaultLocalRanks;
};

}  // namespace

std::unique_ptr<ProgramCli> make_train_cli() { return std::make_unique<TrainCli>(); }

}  // namespace fsdp::tools
