// fsdp-train: the command-line front end. With --nproc N it launches N local ranks of itself;
// started by torchrun, srun or mpirun it is one rank (over MPI by default under mpirun, else
// gloo); with --no-fsdp it is the single-process reference. With none of these it launches 2
// local ranks.
#include "fsdp_train/cli.h"

#include <common/cli_checks.h>
#include <common/launcher.h>
#include <common/torch_program.h>
#include <fsdp/comm/rendezvous.h>
#include <fsdp/data/corpus.h>
#include <fsdp_train/machine_fit.h>
#include <fsdp_train/trainer.h>
#include <models/model.h>

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

// A data spec (fsdp/data/corpus.h): every entry an existing file or a pattern matching some.
CLI::Validator data_spec() {
  return CLI::Validator(
      [](std::string& spec) -> std::string {
        try {
          fsdp::data::expand_data_spec(spec);
        } catch (const std::exception& e) {
          return e.what();
        }
        return "";
      },
      "SPEC");
}

CLI::Validator non_empty() {
  return CLI::Validator(
      [](std::string& text) -> std::string { return text.empty() ? "must not be empty" : ""; },
      "TEXT");
}

// --data, --tokenizer and the held-out data.
void add_data_flags(CLI::App& app, fsdp::train::TrainerOptions& o) {
  const auto positive = integer_at_least(1);
  const auto non_negative = integer_at_least(0);
  app.add_option(
         "--data", o.data_path,
         "Training data: a text file (its bytes are the tokens), llm.c .bin shards, or with "
         "--tokenizer text, .jsonl and .bin files, comma-separated, globs; default: the "
         "embedded corpus")
      ->check(data_spec());
  app.add_option("--tokenizer", o.tokenizer_path,
                 "tokenizer.json (tokenizer_config.json beside it names BOS/EOS) that tokenizes "
                 "--data and --val-data; the model's vocabulary becomes the tokenizer's")
      ->check(existing_file());
  app.add_option("--text-field", o.text_field, "The field holding a .jsonl document's text")
      ->check(non_empty())
      ->capture_default_str();
  app.add_option("--val-data", o.val_data_path,
                 "Held-out data for --val-every, read as --data (default, when training on the "
                 "embedded corpus: its last 10%, which then does not train)")
      ->check(data_spec());
  app.add_option("--val-every", o.val_every, "Held-out loss every N steps (0: only at the end)")
      ->check(non_negative)
      ->capture_default_str();
  app.add_option("--val-batches", o.val_batches, "Global batches per held-out evaluation")
      ->check(positive)
      ->capture_default_str();
}

// The learning-rate schedule.
void add_schedule_flags(CLI::App& app, fsdp::train::TrainerOptions& o) {
  const auto non_negative = integer_at_least(0);
  app.add_option("--lr-schedule", o.lr_schedule,
                 "constant, cosine (to --min-lr) or wsd (warmup, stable, linear decay to --min-lr "
                 "over the last --decay-frac of the steps)")
      ->check(CLI::IsMember({"constant", "cosine", "wsd"}))
      ->capture_default_str();
  app.add_option("--warmup-steps", o.warmup_steps,
                 "Linear learning-rate warm-up over the first N steps")
      ->check(non_negative)
      ->capture_default_str();
  app.add_option("--min-lr", o.min_lr, "Final learning rate of cosine and wsd")
      ->check(finite_in(0, 1e6))
      ->capture_default_str();
  app.add_option("--decay-frac", o.decay_frac, "wsd: fraction of the steps that decay")
      ->check(finite_in(0, 1))
      ->capture_default_str();
}

// fp16's dynamic loss scaling: torch.amp.GradScaler's parameters, names and defaults.
void add_grad_scaler_flags(CLI::App& app, fsdp::train::TrainerOptions& o) {
  app.add_option("--init-scale", o.init_scale,
                 "fp16: the first loss scale (the loss is multiplied by it before backward, the "
                 "gradient shards divided by it after)")
      ->check(finite_in(0, 3.4e38, /*open_min=*/true))
      ->capture_default_str();
  app.add_option("--growth-factor", o.growth_factor,
                 "fp16: multiplies the loss scale after --growth-interval steps in a row without "
                 "overflow")
      ->check(finite_in(1, 1e6, /*open_min=*/true))
      ->capture_default_str();
  app.add_option("--backoff-factor", o.backoff_factor,
                 "fp16: multiplies the loss scale after a step whose gradients overflowed on any "
                 "rank (that step is skipped on every rank); in (0, 1)")
      ->check(finite_in(0, 1, /*open_min=*/true))
      ->capture_default_str();
  app.add_option("--growth-interval", o.growth_interval,
                 "fp16: steps without overflow before the loss scale grows")
      ->check(integer_at_least(1, 2147483647))
      ->capture_default_str();
}

// Sharding strategy, mixed precision, accumulation and prefetch.
void add_mode_flags(CLI::App& app, fsdp::train::TrainerOptions& o) {
  const auto positive = integer_at_least(1);
  app.add_option("--strategy", o.strategy,
                 "full_shard (ZeRO-3), shard_grad_op (ZeRO-2), no_shard (DDP), hybrid_shard "
                 "(HSDP) or whole_tensor (inter-tensor ZeRO-3: each tensor whole on one rank)")
      ->capture_default_str();
  app.add_option("--evenness-priority", o.evenness_priority,
                 "whole_tensor: 1 places tensors for even bytes per rank; lower keeps a block's "
                 "tensors on fewer ranks (fewer broadcasts) at the cost of balance")
      ->check(finite_in(0, 1))
      ->capture_default_str();
  app.add_option("--shard-dim", o.shard_dim,
                 "Shard every parameter with more than D dims along dim D (FSDP2's "
                 "shard_placement_fn returning Shard(D)), the others along dim 0")
      ->check(integer_at_least(0))
      ->capture_default_str();
  app.add_option("--replicate", o.replicate,
                 "hybrid_shard: replicas (the shard groups have W / R ranks)")
      ->check(positive)
      ->capture_default_str();
  app.add_option("--param-dtype", o.param_dtype,
                 "Compute and all-gather dtype: fp32, bf16 or fp16 (masters stay fp32)")
      ->capture_default_str();
  app.add_option("--reduce-dtype", o.reduce_dtype,
                 "Gradient reduction dtype (default: --param-dtype)");
  add_grad_scaler_flags(app, o);
  app.add_option("--grad-accum", o.grad_accum, "Micro-batches per optimizer step")
      ->check(positive)
      ->capture_default_str();
  app.add_option(
         "--accum-mode", o.accum_mode,
         "sync: reduce every micro-batch; no-sync: reduce once per step; no-reshard: also keep "
         "parameters gathered across micro-batches; no-all-reduce (hybrid_shard, no_shard): "
         "reduce-scatter every micro-batch, all-reduce across replicas once per step")
      ->capture_default_str();
  app.add_option("--gradient-divide-factor", o.gradient_divide_factor,
                 "Divide the summed gradients by F instead of averaging them over the "
                 "data-parallel ranks (FSDP2's set_gradient_divide_factor; 0: unset)")
      ->check(finite_in(0, 1e300))
      ->capture_default_str();
  app.add_flag("--force-sum-reduction", o.force_sum_reduction,
               "Every gradient collective sums, the division a separate scaling (FSDP2's "
               "set_force_sum_reduction_for_comms)");
  app.add_option("--wrap-policy", o.wrap_policy,
                 "FSDP units: block (each transformer block, sharded as it is built) or "
                 "min-params:N (FSDP1's size-based auto-wrap: a module owning at least N "
                 "parameter elements not in a unit below it); the root is always a unit")
      ->check(CLI::Validator(
          [](const std::string& value) {
            try {
              fsdp::train::parse_wrap_policy(value);
            } catch (const c10::Error& e) {
              return std::string(e.what_without_backtrace());
            }
            return std::string();
          },
          "block|min-params:N"))
      ->capture_default_str();
  app.add_option("--prefetch", o.prefetch,
                 "1: gather the next unit while this one computes; 0: off")
      ->check(CLI::IsMember({0, 1}))
      ->capture_default_str();
}

// Traces, checkpoints, exports and batch dumps.
void add_output_flags(CLI::App& app, fsdp::train::TrainerOptions& o) {
  const auto non_negative = integer_at_least(0);
  app.add_option(
         "--trace", o.trace_dir,
         "Write each rank's timeline (Chrome trace JSON) to DIR/rank<N>.json, and its flight "
         "record there if a collective fails")
      ->check(output_dir());
  app.add_option(
         "--save", o.save_dir,
         "Write sharded checkpoints under this directory (at the end, and see --save-every)")
      ->check(output_dir(/*created_with_parents=*/true));
  app.add_option("--save-every", o.save_every, "Also save a checkpoint every N steps")
      ->check(non_negative)
      ->capture_default_str();
  app.add_option_function<std::string>(
         "--checkpoint-format",
         [&o](const std::string& name) {
           o.checkpoint_format = *fsdp::checkpoint::parse_checkpoint_format(name);
         },
         "Layout of --save's checkpoints: sharded (ours) or dcp-hf (PyTorch DCP's "
         "HuggingFaceStorageWriter layout, which FSDP2 loads); --resume reads either")
      ->check(CLI::IsMember(fsdp::checkpoint::checkpoint_format_names()))
      ->default_str(fsdp::checkpoint::checkpoint_format_name(o.checkpoint_format));
  app.add_option("--resume", o.resume_dir,
                 "Continue from this checkpoint directory (or a --save directory: its latest); "
                 "'auto': from --save DIR's latest when there is one, else start fresh (a "
                 "restarted job runs the same command)")
      ->check(existing_dir() | CLI::IsMember({"auto"}));
  app.add_option("--export", o.export_path,
                 "Write the final model as Hugging Face GPT-2 safetensors (config.json beside it)")
      ->check(output_file(/*created_with_parents=*/true));
  app.add_option("--export-dtype", o.export_dtype, "Element type of --export: fp32 or bf16")
      ->capture_default_str();
  app.add_option("--init-from", o.init_from,
                 "Initialize the model from Hugging Face weights: a model.safetensors file, or a "
                 "sharded checkpoint (its model.safetensors.index.json, or the directory)")
      ->check(hf_weights());
  app.add_option("--dump-batches", o.dump_batches_path,
                 "Write every step's global (inputs, targets) batch to this file (rank 0; format "
                 "in trainer.h)")
      ->check(output_file());
}

// Every flag's value is checked here, while parsing, before any work starts; what depends on
// several flags is checked by fsdp::train::validate.
// How this process becomes ranks: the flags that do not reach the trainer.
struct LaunchFlags {
  int nproc = 0;
  double timeout_s = 300;
  std::string backend = "auto";
};

void add_all_flags(CLI::App& app, fsdp::train::TrainerOptions& o, LaunchFlags& launch) {
  const auto positive = integer_at_least(1);
  const auto non_negative = integer_at_least(0);
  add_backend_flag(app, launch.backend);
  app.add_option("--nproc", launch.nproc,
                 "Launch this many local ranks (default 2 unless RANK/WORLD_SIZE are set)")
      ->check(positive);
  app.add_option("--model", o.model, "Model config: " + fsdp::models::model_names_joined())
      ->check(CLI::IsMember(fsdp::models::model_names()))
      ->capture_default_str();
  app.add_option("--steps", o.steps, "Optimizer steps")->check(non_negative)->capture_default_str();
  app.add_option("--global-batch", o.global_batch, "Sequences per step over all ranks")
      ->check(positive)
      ->capture_default_str();
  app.add_option("--seq-len", o.seq_len, "Tokens per sequence")
      ->check(positive)
      ->capture_default_str();
  app.add_option("--lr", o.lr, "AdamW learning rate")
      ->check(finite_in(0, 1e6, /*open_min=*/true))
      ->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay, "AdamW weight decay")
      ->check(finite_in(0, 1e6))
      ->capture_default_str();
  app.add_flag("--decay-all", o.decay_all,
               "Weight decay on every parameter; by default only 2-D and larger ones (matrices, "
               "embeddings) decay, as in nanoGPT and torchtitan, and biases and norm weights "
               "do not");
  app.add_option("--max-grad-norm", o.max_grad_norm,
                 "Clip the global gradient norm to this (inf: no clipping)")
      ->check(positive_or_inf())
      ->capture_default_str();
  app.add_option("--skip-nonfinite", o.skip_nonfinite,
                 "Skip up to N steps whose loss or gradient norm is not finite (no rank updates); "
                 "the next one stops training. 0: the first one stops it, naming the step, the "
                 "ranks and the first unit with a non-finite gradient")
      ->check(integer_at_least(0))
      ->capture_default_str();
  app.add_option("--seed", o.seed, "Seed of the initial weights and of batch sampling")
      ->check(non_negative)
      ->capture_default_str();
  app.add_option("--reshard-after-forward", o.reshard_after_forward,
                 "1: blocks free their gathered parameters after forward; 0: they keep them until "
                 "backward; N >= 2: they keep a 1/N piece and backward gathers within groups of N "
                 "ranks (ZeRO++ hpZ; N divides the shard group)")
      ->check(non_negative)
      ->capture_default_str();
  app.add_option("--all-gather", o.all_gather,
                 "Every unit's weight all-gather: fp (in the compute dtype) or int8[:BLOCK] "
                 "(ZeRO++ qwZ: blockwise int8, one fp32 scale per BLOCK elements, default 256; the "
                 "fp32 shards the optimizer steps stay exact)")
      ->capture_default_str();
  app.add_flag(
      "--activation-checkpoint", o.activation_checkpoint,
      "Every transformer block recomputes its forward in backward instead of keeping activations");
  app.add_flag("--no-fsdp", o.no_fsdp,
               "Single-process plain LibTorch reference on the same global batch");
  app.add_option("--device", o.device,
                 "cpu, or cuda: each rank computes on its process group's GPU (needs a backend "
                 "that communicates on cuda: --backend auto picks nccl)")
      ->capture_default_str();
  app.add_flag("--offload", o.offload,
               "Keep sharded parameters, gradients and optimizer state in host memory (FSDP2's "
               "CPUOffloadPolicy; pinned with --device cuda); the optimizer steps on the host");
  add_data_flags(app, o);
  add_schedule_flags(app, o);
  app.add_option("--metrics", o.metrics_path,
                 "Write one JSON object per step to this file (rank 0)")
      ->check(output_file());
  app.add_option("--log-every", o.log_every, "Print progress every N steps")
      ->check(positive)
      ->capture_default_str();
  app.add_option("--timeout-s", launch.timeout_s, "Collective and rendezvous timeout in seconds")
      ->check(finite_in(0, 1e7, /*open_min=*/true))
      ->capture_default_str();
  app.add_flag("--quiet", o.quiet, "No progress lines");
  add_mode_flags(app, o);
  add_output_flags(app, o);
}

// --backend auto: nccl for a run on CUDA devices (the only backend that moves CUDA tensors),
// otherwise what the launch suggests (mpi under mpirun, else gloo).
std::string backend_for(const std::string& asked, const fsdp::LaunchEnv& env,
                        const std::string& device) {
  if (asked != "auto") return asked;
  if (c10::Device(device).is_cuda()) return "nccl";
  return fsdp::default_backend(env);
}

class TrainCli : public TorchProgramCli {
 public:
  const char* name() const override { return "fsdp-train"; }
  const char* description() const override {
    return "fsdp-train: train a transformer with fully sharded data parallelism on LibTorch";
  }
  void add_flags(CLI::App& app) override { add_all_flags(app, o_, launch_); }

  // How this process runs (one process, one rank of a launcher's job, or the launcher of
  // local ranks), and in the first and last case every flag against the others before any rank
  // starts. A rank of a launcher's job is checked by train() itself.
  void check(const CLI::App& app) override {
    const bool nproc_given = app.count("--nproc") > 0;
    if (o_.no_fsdp) {
      TORCH_CHECK(!nproc_given, "--no-fsdp runs one process; drop --nproc ", launch_.nproc);
      mode_ = Mode::kSingleProcess;
      ranks_ = 1;
    } else if (!nproc_given && fsdp::launched_by_a_launcher()) {
      mode_ = Mode::kRankOfALaunch;
      return;
    } else {
      check_backend_launches_locally(launch_.backend, name());
      mode_ = Mode::kLocalRanks;
      ranks_ = nproc_given ? launch_.nproc : kDefaultLocalRanks;
      TORCH_CHECK(ranks_ >= 1, "--nproc must be at least 1, got ", ranks_);
    }
    fsdp::train::validate(o_, ranks_);  // report bad flags once, before starting any rank
    fsdp::train::check_ranks_fit_memory(o_, ranks_, ranks_);
  }

  int run(const CLI::App&, const std::vector<std::string>& args) override {
    switch (mode_) {
      case Mode::kSingleProcess:
        set_intra_op_threads(1);
        fsdp::train::train(o_, nullptr);
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

  // Launched by torchrun, Slurm's srun or Open MPI's mpirun: this process is one rank.
  int run_rank() {
    const fsdp::LaunchEnv env = fsdp::launch_env_from_environment();
    set_intra_op_threads(env.local_world_size);
    fsdp::ProcessGroupOptions pg_options;
    pg_options.backend = backend_for(launch_.backend, env, o_.device);
    pg_options.timeout = std::chrono::milliseconds(static_cast<int64_t>(launch_.timeout_s * 1000));
    if (!o_.trace_dir.empty()) {
      ::mkdir(o_.trace_dir.c_str(), 0755);  // an error shows when the trace is written
      pg_options.flight_recorder_dir = o_.trace_dir;
    }
    auto group = fsdp::init_process_group(env, pg_options);
    fsdp::train::train(o_, group);
    return 0;
  }

  fsdp::train::TrainerOptions o_;
  LaunchFlags launch_;
  Mode mode_ = Mode::kLocalRanks;
  int ranks_ = kDefaultLocalRanks;
};

}  // namespace

std::unique_ptr<ProgramCli> make_train_cli() { return std::make_unique<TrainCli>(); }

}  // namespace fsdp::tools
