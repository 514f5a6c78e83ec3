// fsdp-train's training loop.
//
// Invariants that make a sharded run comparable to the --no-fsdp reference:
// - every process builds the same global batch for a step (data.h) and rank r trains on rows
//   [r*B/W, (r+1)*B/W) of it, so the ranks' micro-batches concatenated in rank order are the
//   reference's batch;
// - every parameter's initial value depends only on its name and the seed (models/model.h), so
//   the sharded model, built and sharded unit by unit, starts where the reference starts;
// - the reported loss is the mean over ranks of the micro-batch losses, which equals the
//   reference's loss on the global batch because micro-batches have equal sizes; fine-tuning
//   data, whose ranks train different numbers of targets, scales each rank's summed loss so
//   that the same mean is the global mean over trained targets (see [Note: the mean over
//   trained targets]).
// - the learning rate of step s is lr_at(schedule, s) (schedule.h), set on every param group
//   before the optimizer step: no state, so a resumed run takes the same rates;
// - the held-out loss runs forward only, without autograd, after the step's numbers are taken:
//   it changes no parameter and no optimizer state, so training is bit-identical with or
//   without it, and its batches come from a fixed seed, so every evaluation sees the same ones.
//
// train() reads top to bottom: set-up (Run), then per step train_step() (forward and backward
// per micro-batch, clip, step) and the helpers around it (held-out loss, metrics, progress,
// periodic save), then the final save, export and trace.
#include <fsdp_train/trainer.h>

#include <fsdp/checkpoint/checkpoint.h>
#include <fsdp/clip_grad.h>
#include <fsdp/comm/comm_hooks.h>
#include <fsdp/device_mesh.h>
#include <fsdp/fully_shard.h>
#include <fsdp/grad_scaler.h>
#include <fsdp/memory_estimate.h>
#include <fsdp/runtime/whole_tensor.h>
#include <fsdp/util/memory_counter.h>
#include <fsdp/wrap_policy.h>
#include <fsdp_train/corpus.h>
#include <fsdp_train/data.h>
#include <fsdp_train/export.h>
#include <fsdp_train/nonfinite.h>
#include <fsdp_train/schedule.h>
#include <fsdp_train/sources.h>
#include <fsdp_train/step_metrics.h>
#include <models/model.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>
#include <nlohmann/json.hpp>

#include <sys/stat.h>
#include <unistd.h>
#include <csignal>
#include <sstream>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <thread>
#include <unordered_set>

namespace fsdp::train {
namespace {

using Clock = std::chrono::steady_clock;

std::string format_duration(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

int64_t tensor_bytes(const std::vector<at::Tensor>& tensors) {
  int64_t bytes = 0;
  for (const auto& t : tensors) bytes += t.defined() ? t.nbytes() : 0;
  return bytes;
}

int64_t grad_bytes(const std::vector<at::Tensor>& params) {
  int64_t bytes = 0;
  for (const auto& p : params) bytes += p.grad().defined() ? p.grad().nbytes() : 0;
  return bytes;
}

int64_t optimizer_bytes(torch::optim::AdamW& optimizer) {
  int64_t bytes = 0;
  for (const auto& [key, state] : optimizer.state()) {
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*state);
    bytes += tensor_bytes({s.exp_avg(), s.exp_avg_sq(), s.max_exp_avg_sq()});
  }
  return bytes;
}

// The RankStepStats fields every rank sends, named once for packing and unpacking.
constexpr int64_t RankStepStats::*kGatheredFields[] = {
    &RankStepStats::param_bytes,      &RankStepStats::grad_bytes,
    &RankStepStats::optim_bytes,      &RankStepStats::peak_unsharded_bytes,
    &RankStepStats::all_gather_bytes, &RankStepStats::reduce_scatter_bytes,
    &RankStepStats::all_reduce_bytes, &RankStepStats::peak_rss_bytes,
    &RankStepStats::sent_bytes,       &RankStepStats::peak_alloc_bytes,
    &RankStepStats::activation_bytes, &RankStepStats::broadcast_bytes,
    &RankStepStats::reduce_bytes};
constexpr int64_t kGatheredCount = std::size(kGatheredFields);

// Every rank's stats, gathered to every rank (one small all-gather of int64s per step).
std::vector<RankStepStats> gather_stats(const RankStepStats& mine, ProcessGroup* group) {
  if (group == nullptr) return {mine};
  const int world = group->size();
  at::Tensor local = at::empty({kGatheredCount}, at::kLong);
  for (int64_t i = 0; i < kGatheredCount; ++i)
    local.data_ptr<int64_t>()[i] = mine.*kGatheredFields[i];
  at::Tensor all = at::empty({world * kGatheredCount}, at::kLong);
  group->all_gather_into_tensor(all, local)->wait();
  std::vector<RankStepStats> result(world);
  for (int r = 0; r < world; ++r) {
    result[r].rank = r;
    const int64_t* row = all.data_ptr<int64_t>() + kGatheredCount * r;
    for (int64_t i = 0; i < kGatheredCount; ++i) result[r].*kGatheredFields[i] = row[i];
  }
  return result;
}

// A "<key> <number>" line of a /proc/self file (status: kB, io: bytes), or 0 if absent.
int64_t proc_self_field(const char* file, const std::string& key) {
  std::ifstream in(std::string("/proc/self/") + file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size(), key) == 0) return std::atoll(line.c_str() + key.size());
  }
  return 0;
}
int64_t peak_rss_bytes() { return proc_self_field("status", "VmHWM:") * 1024; }
int64_t written_bytes() { return proc_self_field("io", "wchar:"); }

// Little-endian int64s, as --dump-batches documents (every platform we build on is
// little-endian, so the bytes are written as they are in memory).
void write_int64s(std::ofstream& out, const std::vector<int64_t>& values) {
  out.write(reinterpret_cast<const char*>(values.data()),
            static_cast<std::streamsize>(values.size() * sizeof(int64_t)));
}
void write_int64s(std::ofstream& out, const at::Tensor& values) {
  const at::Tensor v = values.to(at::kLong).contiguous();
  out.write(reinterpret_cast<const char*>(v.data_ptr<int64_t>()),
            static_cast<std::streamsize>(v.numel() * sizeof(int64_t)));
}

LrSchedule lr_schedule_of(const JobConfig& o) {
  LrSchedule s;
  s.kind = o.training.lr_schedule;
  s.peak_lr = o.training.lr;
  s.min_lr = o.training.min_lr;
  s.warmup_steps = o.training.warmup_steps;
  s.decay_frac = o.training.decay_frac;
  s.total_steps = o.training.steps;
  return s;
}

// What decides the learning rate of every step; a resume must match it. The total number of
// steps only matters to schedules that decay.
nlohmann::json lr_schedule_json(const JobConfig& o) {
  return {
      {"lr_schedule", name_of(lr_schedule_names(), o.training.lr_schedule)},
      {"lr", o.training.lr},
      {"warmup_steps", o.training.warmup_steps},
      {"min_lr", o.training.min_lr},
      {"decay_frac", o.training.decay_frac},
      {"total_steps", o.training.lr_schedule == LrScheduleKind::kConstant ? 0 : o.training.steps}};
}

// What a checkpoint records about the run: the options that decide the model and the batches,
// and the data position (batches are a pure function of (seed, step), so the next step is the
// position; the rest makes a mismatch visible).
nlohmann::json trainer_json(const JobConfig& o) {
  return {{"model", o.model.name},
          {"seed", o.training.seed},
          {"global_batch", o.training.global_batch},
          {"seq_len", o.training.seq_len},
          {"lr", o.training.lr},
          {"weight_decay", o.training.weight_decay},
          {"decay_all", o.training.decay_all},
          {"max_grad_norm", o.training.max_grad_norm},
          {"no_fsdp", o.parallelism.no_fsdp},
          {"reshard_after_forward", o.parallelism.reshard_after_forward},
          {"data_path", o.data.path},
          {"tokenizer", o.data.tokenizer},
          {"text_field", o.data.text_field},
          {"schedule", lr_schedule_json(o)}};
}

std::string run_state_json(const JobConfig& o, const TokenDataset& data, int64_t next_step,
                           int64_t skipped_steps) {
  const nlohmann::json j = {{"trainer", trainer_json(o)},
                            {"skipped_steps", skipped_steps},
                            {"data",
                             {{"source", data.source()},
                              {"tokens", data.size()},
                              {"next_step", next_step},
                              {"seed", o.training.seed},
                              {"global_batch", o.training.global_batch},
                              {"seq_len", o.training.seq_len}}}};
  return j.dump();
}

// Rank 0's note when a run resumes with settings that change the batches or the model.
void report_resume_mismatches(const JobConfig& o, const std::string& user_json) {
  const auto saved = nlohmann::json::parse(user_json, nullptr, false);
  if (!saved.is_object() || !saved.contains("trainer") || !saved["trainer"].is_object()) return;
  const nlohmann::json& t = saved["trainer"];
  const nlohmann::json now = trainer_json(o);
  for (const char* key : {"model", "seed", "global_batch", "seq_len", "lr", "weight_decay"}) {
    if (t.contains(key) && t[key] != now[key]) {
      fmt::print(stderr,
                 "fsdp-train: note: the checkpoint was saved with {} = {}, this run uses {}\n", key,
                 t[key].dump(), now[key].dump());
    }
  }
}

// A resume must train on the same data with the same learning rates as the run it continues:
// every rank refuses a checkpoint whose trainer JSON says otherwise (older checkpoints, without
// these keys, are taken as they are).
void check_resume_compatible(const JobConfig& o, const std::string& user_json) {
  const auto saved = nlohmann::json::parse(user_json, nullptr, false);
  if (!saved.is_object() || !saved.contains("trainer") || !saved["trainer"].is_object()) return;
  const nlohmann::json& t = saved["trainer"];
  const nlohmann::json now = trainer_json(o);
  for (const char* key : {"data_path", "tokenizer", "text_field"}) {
    TORCH_CHECK(!t.contains(key) || t[key] == now[key],
                "--resume: the checkpoint was trained with ", key, " ", t[key].dump(),
                ", this run gives ", now[key].dump(),
                "; resume with the same --data, --tokenizer and --text-field");
  }
  TORCH_CHECK(!t.contains("schedule") || t["schedule"] == now["schedule"],
              "--resume: the checkpoint's learning-rate schedule is ", t["schedule"].dump(),
              ", this run's is ", now["schedule"].dump(),
              "; resume with the same --lr, --lr-schedule, --warmup-steps, --min-lr, "
              "--decay-frac (and --steps, for a decaying schedule)");
}

}  // namespace

namespace {

// The seed of the held-out batches: fixed, so that every evaluation sees the same tokens.
constexpr uint64_t kValSeed = 0x76616c;  // "val"

// Everything one rank's training run holds, built once by set_up() and then read by the step and
// the helpers around it. Never moved: the mesh's unit hooks refer to it.
struct Run {
  Run(const JobConfig& options, std::shared_ptr<ProcessGroup> process_group)
      : o(options), group(std::move(process_group)) {}
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  const JobConfig& o;
  std::shared_ptr<ProcessGroup> group;  // null: the --no-fsdp reference
  int world = 1;
  int rank = 0;
  bool printing = false;  // rank 0 without --quiet

  c10::Device device = at::kCPU;  // where the model computes (--device)
  bool count_memory = false;      // --metrics or --tensorboard counts CPU tensor bytes
  // Activation bytes are counted on this (the compute) thread only: a collective's temporaries
  // on the process group's thread are not autograd's, whenever they happen to be freed.
  std::shared_ptr<MemoryCounter> thread_memory = std::make_shared<MemoryCounter>();
  std::optional<CountAllocations> count_thread;

  std::shared_ptr<const models::ModelSpec> spec;
  std::optional<DeviceMesh> mesh;
  std::unique_ptr<models::Model> built;
  std::shared_ptr<torch::nn::Module> model;
  std::optional<FSDPModule> root;
  // The --no-fsdp reference has no mesh; it traces its compute into a tracer of its own.
  Tracer reference_tracer;
  Tracer* tracer = &reference_tracer;
  std::vector<at::Tensor> params;
  std::unique_ptr<torch::optim::AdamW> optimizer;
  LrSchedule schedule;

  std::optional<StepMetrics> metrics;  // rank 0
  std::ofstream batches;               // --dump-batches, format in trainer.h
  int64_t first_step = 0;
  double elapsed = 0;                       // seconds spent in steps so far
  double tokens_done = 0;                   // tokens trained in those steps (tokens_per_s's)
  int64_t skipped_steps = 0;                // non-finite steps skipped (--skip-nonfinite)
  std::optional<ShardedGradScaler> scaler;  // fp16's dynamic loss scaling
  int64_t overflow_skips = 0;               // steps skipped because gradients overflowed (fp16)
  int64_t resumed_skips = 0;                // steps the run a resume continues skipped
  int64_t units = 0;                        // FSDP units, the root included (0 without FSDP)
  std::string placement;                    // --strategy whole_tensor: the partition, described
};

// What a step measures around its forward and backward, for RankStepStats.
struct StepProbe {
  Clock::time_point start;
  int64_t written_at_start = 0;
  int64_t live_before_forward = 0;
  MemorySnapshot held_before_forward;
  int64_t activation_bytes = 0;
  int64_t grad_bytes = 0;
};

// Every step so far that updated nothing, on every rank.
int64_t skipped_steps(const Run& run) {
  return run.skipped_steps + run.overflow_skips + run.resumed_skips;
}

// --device: the process group's device under FSDP (with its index), which must be the kind asked
// for; the current one of that kind for the --no-fsdp reference.
c10::Device device_of(const Run& run) {
  const c10::Device asked(run.o.parallelism.device == DeviceKind::kCuda ? c10::kCUDA : c10::kCPU);
  if (!run.group) return asked;
  const c10::Device group_device = run.group->device();
  TORCH_CHECK(group_device.type() == asked.type(), "--device ", run.o.parallelism.device, ": the ",
              run.group->backend_name(), " backend communicates on ", group_device,
              "; use a backend that communicates on ", run.o.parallelism.device);
  return group_device;
}

void build_mesh(Run& run) {
  run.device = device_of(run);
  if (!run.group) return;
  const int replicate = run.o.parallelism.strategy == ShardingStrategy::kNoShard ? run.world
                        : run.o.parallelism.strategy == ShardingStrategy::kHybridShard
                            ? run.o.parallelism.replicate
                            : 1;
  run.mesh.emplace(DeviceMesh::hybrid(run.group, replicate));
}

// Every unit's: mixed precision, and --offload (pinned only where there is a device to copy to).
FullyShardOptions shard_options(const Run& run, const MixedPrecisionPolicy& mp_policy) {
  FullyShardOptions options;
  options.mp_policy(mp_policy);
  if (run.o.parallelism.shard_dim > 0) {
    const int64_t d = run.o.parallelism.shard_dim;
    options.shard_placement_fn(
        [d](const std::string&, const at::Tensor& p) -> std::optional<int64_t> {
          if (p.dim() > d) return d;
          return std::nullopt;
        });
  }
  if (run.o.parallelism.offload) {
    options.offload_policy(CPUOffloadPolicy().pin_memory(!run.device.is_cpu()));
  }
  return options;
}

// Moves the parameters no unit manages yet to device (a unit's are on the mesh's device, or on
// the host when offloaded, and stay there). Nothing moves on CPU.
void move_unsharded_parameters(torch::nn::Module& model, c10::Device device) {
  if (device.is_cpu()) return;
  std::unordered_set<const c10::TensorImpl*> sharded;
  for (const FSDPModule& unit : fsdp_modules_under(model)) {
    for (const ShardedParameter& p : unit.sharded_parameters()) {
      sharded.insert(p.local.unsafeGetTensorImpl());
    }
  }
  at::NoGradGuard no_grad;
  for (auto& p : unique_parameters(model)) {
    if (sharded.count(p.unsafeGetTensorImpl()) == 0) p.set_data(p.data().to(device));
  }
  for (auto& b : model.buffers()) b.set_data(b.data().to(device));
}

// The blocks' FullyShardOptions: ZeRO-2 keeps every block's parameters from its forward to its
// backward; otherwise --reshard-after-forward decides (N >= 2: hpZ).
FullyShardOptions unit_shard_options(const Run& run, const MixedPrecisionPolicy& mp_policy) {
  FullyShardOptions unit_options = shard_options(run, mp_policy);
  const int reshard = run.o.parallelism.reshard_after_forward;
  if (run.o.parallelism.strategy == ShardingStrategy::kShardGradOp) {
    unit_options.reshard_after_forward(false);
  } else if (reshard >= 2) {
    unit_options.reshard_after_forward(reshard);
  } else {
    unit_options.reshard_after_forward(reshard == 1);
  }
  return unit_options;
}

// AdamW in two groups, as nanoGPT and torchtitan: --weight-decay on matrices and embeddings (2-D
// and up), none on biases and norm weights; with --decay-all one group, everything decays.
std::unique_ptr<torch::optim::AdamW> make_optimizer(const std::vector<at::Tensor>& params,
                                                    const JobConfig& o) {
  const auto options = torch::optim::AdamWOptions(o.training.lr).betas({0.9, 0.95});
  std::vector<at::Tensor> decayed, undecayed;
  for (const auto& p : params)
    (o.training.decay_all || p.dim() >= 2 ? decayed : undecayed).push_back(p);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!decayed.empty()) {
    groups.emplace_back(
        decayed, std::make_unique<torch::optim::AdamWOptions>(
                     torch::optim::AdamWOptions(options).weight_decay(o.training.weight_decay)));
  }
  if (!undecayed.empty()) {
    groups.emplace_back(undecayed, std::make_unique<torch::optim::AdamWOptions>(
                                       torch::optim::AdamWOptions(options).weight_decay(0)));
  }
  return std::make_unique<torch::optim::AdamW>(std::move(groups), options);
}

// Builds the model; under FSDP with deferred initialization: each unit is sharded as soon as
// it is built, so a rank never holds more than the root's parameters plus one unit in full.
// --trace's memory counter track: at every traced event and every change of the runtime's
// memory, the bytes of the runtime's categories
// (unsharded parameters and gradients, communication buffers) and of every live CPU tensor of
// the process (one rank per process under --nproc and launchers: the rank's own), which
// includes the sharded state, activations and temporaries.
void trace_memory(Tracer& tracer, RankStats& stats) {
  stats.set_observer([&tracer] { tracer.sample_counters(); });
  tracer.set_counter_sampler("memory (bytes)", [&stats] {
    const MemorySnapshot live = stats.live();
    return Tracer::Sample{{"unsharded params", live.unsharded_param_bytes},
                          {"unsharded grads", live.unsharded_grad_bytes},
                          {"comm buffers", live.comm_buffer_bytes},
                          {"all tensors", process_cpu_memory().live_bytes()}};
  });
}

// --strategy whole_tensor: the model is built whole (the partition needs every tensor's size
// first), then each block and the root are sharded with one owner rank per tensor.
FSDPModule shard_whole_tensors(Run& run, const FullyShardOptions& unit_options,
                               const MixedPrecisionPolicy& mp_policy) {
  std::vector<std::shared_ptr<torch::nn::Module>> units;
  for (const auto& unit : run.built->units()) units.push_back(unit.second);
  const auto options = WholeTensorShardOptions()
                           .partition(WholeTensorPartitionOptions().evenness_priority(
                               run.o.parallelism.evenness_priority))
                           .unit_options(unit_options)
                           .root_mp_policy(mp_policy);
  WholeTensorSharding sharding = whole_tensor_shard(run.model, units, *run.mesh, options);
  run.placement = sharding.partition.describe();
  return sharding.root;
}

void build_model(Run& run) {
  const JobConfig& o = run.o;
  MixedPrecisionPolicy mp_policy;
  if (o.parallelism.param_dtype != at::kFloat) mp_policy.param_dtype(o.parallelism.param_dtype);
  mp_policy.reduce_dtype(o.parallelism.reduce_dtype);
  models::BuildOptions model_options;
  model_options.seed(o.training.seed);
  model_options.activation_checkpoint(o.model.activation_checkpoint);
  const std::optional<int64_t> min_params = o.parallelism.wrap_policy.min_params;
  const FullyShardOptions unit_options = unit_shard_options(run, mp_policy);
  const FullyShardOptions root_options = shard_options(run, mp_policy);
  const bool whole_tensor = run.o.parallelism.strategy == ShardingStrategy::kWholeTensor;
  if (run.mesh && !min_params && !whole_tensor) {
    model_options.on_unit_built(
        [&run, unit_options](const std::string&, const std::shared_ptr<torch::nn::Module>& block) {
          move_unsharded_parameters(*block, run.device);
          fully_shard(block, *run.mesh, unit_options);
        });
  }
  run.built = run.spec->build(model_options);
  run.model = run.built->root();
  move_unsharded_parameters(*run.model, run.device);
  if (run.mesh) {
    // --wrap-policy min-params:N chooses units in the whole built model (no deferred init).
    run.root =
        whole_tensor ? shard_whole_tensors(run, unit_options, mp_policy)
        : min_params
            ? fully_shard_tree(
                  run.model, *run.mesh, size_based_wrap_policy(*min_params),
                  FullyShardTreeOptions().unit_options(unit_options).root_options(root_options))
            : fully_shard(run.model, *run.mesh, root_options);
    run.root->set_implicit_prefetch(o.parallelism.prefetch);
    if (const auto block = o.parallelism.all_gather.int8_block) {
      const auto int8 = std::make_shared<Int8AllGather>(*block);
      for (FSDPModule& unit : fsdp_modules_under(*run.model)) unit.set_custom_all_gather(int8);
    }
    for (FSDPModule unit : fsdp_modules_under(*run.model)) {
      if (o.parallelism.gradient_divide_factor > 0)
        unit.set_gradient_divide_factor(o.parallelism.gradient_divide_factor);
      unit.set_force_sum_reduction_for_comms(o.parallelism.force_sum_reduction);
    }
    run.units = static_cast<int64_t>(fsdp_modules_under(*run.model).size());
    run.tracer = &run.mesh->tracer();
  }
  if (!o.metrics.trace_dir.empty() && run.mesh) trace_memory(*run.tracer, run.mesh->stats());
  run.tracer->enable(!o.metrics.trace_dir.empty());
  run.params = unique_parameters(*run.model);
  run.optimizer = make_optimizer(run.params, o);
  if (o.parallelism.param_dtype == at::kHalf && run.mesh) {
    run.scaler.emplace(*run.mesh, GradScalerOptions()
                                      .init_scale(o.training.grad_scaler.init_scale)
                                      .growth_factor(o.training.grad_scaler.growth_factor)
                                      .backoff_factor(o.training.grad_scaler.backoff_factor)
                                      .growth_interval(o.training.grad_scaler.growth_interval));
  }
}

void open_outputs(Run& run) {
  const JobConfig& o = run.o;
  if (run.rank != 0) return;
  run.metrics.emplace(o.metrics);
  if (!o.debug.dump_batches_path.empty()) {
    run.batches.open(o.debug.dump_batches_path, std::ios::out | std::ios::trunc | std::ios::binary);
    TORCH_CHECK(run.batches.good(), "cannot open --dump-batches file '", o.debug.dump_batches_path,
                "' for writing");
    run.batches.write("FSDPBAT1", 8);
    write_int64s(run.batches, {o.training.global_batch / o.training.grad_accum, o.training.seq_len,
                               o.training.grad_accum});
  }
}

// The FSDP units, in pre-order (the root first), with the parameter elements each owns.
std::string describe_units(const Run& run) {
  std::string list;
  for (const FSDPModule& unit : fsdp_modules_under(*run.model)) {
    int64_t elements = 0;
    for (const ShardedParameter& p : unit.sharded_parameters()) {
      int64_t n = 1;
      for (const int64_t d : p.metadata.global_shape) n *= d;
      elements += n;
    }
    list += fmt::format("{}{} ({})", list.empty() ? "" : ", ",
                        unit.path().empty() ? "root" : unit.path(), elements);
  }
  return list;
}

void print_banner(const Run& run, const TokenDataset& data, double unigram_entropy) {
  if (!run.printing) return;
  const JobConfig& o = run.o;
  fmt::print(
      "fsdp-train: model {} ({:.2f}M parameters), {} on {} rank{}, {} steps of {} x {} tokens, "
      "data: {} ({} {}, unigram entropy {:.3f} nats)\n",
      o.model.name, run.spec->num_parameters() / 1e6, o.parallelism.no_fsdp ? "no FSDP" : "FSDP",
      run.world, run.world == 1 ? "" : "s", o.training.steps, o.training.global_batch,
      o.training.seq_len, data.source(), data.size(),
      data.tokens().scalar_type() == at::kByte ? "bytes" : "tokens", unigram_entropy);
  if (data.labeled()) {
    fmt::print(
        "fsdp-train: fine-tuning data: {} of its {} tokens train (the others are masked); the "
        "loss is the mean over trained targets, and tokens/s counts those\n",
        trained_targets(data.labels()), data.size());
  }
  if (run.root) {
    fmt::print("fsdp-train: {} FSDP units (--wrap-policy {}), parameter elements each: {}\n",
               run.units, to_string(o.parallelism.wrap_policy), describe_units(run));
  }
  if (const auto block = o.parallelism.all_gather.int8_block; block && run.root) {
    fmt::print(
        "fsdp-train: weight all-gathers in int8 (ZeRO++ qwZ), one fp32 scale per {} "
        "elements\n",
        *block);
  }
  if (!run.placement.empty()) {
    fmt::print("fsdp-train: whole_tensor placement (--evenness-priority {}): {}\n",
               o.parallelism.evenness_priority, run.placement);
  }
  std::fflush(stdout);
}

// Where --resume loads from: its directory, or under --resume auto the --save directory when it
// holds a checkpoint (its `latest`), else nowhere: the first start of a job that restarts with
// the same command.
std::string resume_dir_of(const Run& run) {
  const JobConfig& o = run.o;
  if (o.checkpoint.resume != "auto") return o.checkpoint.resume;
  if (::access((o.checkpoint.save_dir + "/latest").c_str(), F_OK) == 0)
    return o.checkpoint.save_dir;
  if (run.printing)
    fmt::print("fsdp-train: --resume auto: no checkpoint in {} yet; starting fresh\n",
               o.checkpoint.save_dir);
  return "";
}

// fp16: the scale and growth tracker of the run a resume continues, and the steps it skipped.
// The checkpoint's hyper-parameters must be this run's: a resume continues that run.
void restore_grad_scaler(Run& run, const checkpoint::LoadResult& loaded) {
  const auto saved = nlohmann::json::parse(loaded.user_json, nullptr, false);
  if (saved.is_object() && saved.contains("skipped_steps") &&
      saved["skipped_steps"].is_number_integer()) {
    run.resumed_skips = saved["skipped_steps"].get<int64_t>();
  }
  if (!run.scaler) return;
  if (!loaded.grad_scaler) {
    if (run.printing) {
      fmt::print(
          "fsdp-train: the checkpoint has no gradient scaler (it was not trained in fp16); "
          "the loss scale starts at --init-scale {}\n",
          run.o.training.grad_scaler.init_scale);
    }
    return;
  }
  const GradScalerState& s = *loaded.grad_scaler;
  const GradScalerState mine = run.scaler->state();
  TORCH_CHECK(s.growth_factor == mine.growth_factor && s.backoff_factor == mine.backoff_factor &&
                  s.growth_interval == mine.growth_interval,
              "--resume: the checkpoint's gradient scaler has growth factor ", s.growth_factor,
              ", backoff factor ", s.backoff_factor, " and growth interval ", s.growth_interval,
              ", this run's ", mine.growth_factor, ", ", mine.backoff_factor, " and ",
              mine.growth_interval,
              "; resume with the same --growth-factor, --backoff-factor and "
              "--growth-interval");
  run.scaler->load_state(s);
}

// --init-from, then --resume (which sets the first step).
void load_initial_state(Run& run) {
  const JobConfig& o = run.o;
  if (!o.model.init_from.empty()) {
    checkpoint::load_full(o.model.init_from, *run.model, run.group.get(), run.spec->hf_layout());
    if (run.printing) fmt::print("fsdp-train: initialized from {}\n", o.model.init_from);
  }
  const std::string resume_dir = resume_dir_of(run);
  if (resume_dir.empty()) return;
  const checkpoint::LoadResult loaded =
      checkpoint::load_checkpoint(resume_dir, *run.model, run.optimizer.get(), run.group.get());
  check_resume_compatible(o, loaded.user_json);
  restore_grad_scaler(run, loaded);
  run.first_step = loaded.step;
  TORCH_CHECK(run.first_step <= o.training.steps, "--resume ", loaded.path, " is at step ",
              run.first_step, ", past --steps ", o.training.steps, " (the total number of steps)");
  if (!run.printing) return;
  fmt::print(
      "fsdp-train: resumed from {} at step {} (saved by {} rank{}): {:.1f} MB loaded in "
      "{:.2f}s ({:.0f} MB/s), {:.1f} MB of it read by rank 0\n",
      loaded.path, run.first_step, loaded.saved_world_size, loaded.saved_world_size == 1 ? "" : "s",
      loaded.checkpoint_bytes / 1e6, loaded.seconds, loaded.checkpoint_bytes / 1e6 / loaded.seconds,
      loaded.bytes_read / 1e6);
  report_resume_mismatches(o, loaded.user_json);
}

// The sum over ranks of a rank's loss (one all-reduce when there are ranks).
double sum_over_ranks(const at::Tensor& loss, const Run& run) {
  at::Tensor sum = loss.detach().to(at::kDouble).reshape({1});
  if (run.group) run.group->all_reduce(sum, ReduceOp::kSum)->wait();
  return sum.item<double>();
}

double mean_over_ranks(const at::Tensor& loss, const Run& run) {
  return sum_over_ranks(loss, run) / run.world;
}

// [Note: the mean over trained targets]
// Plain data: each rank's loss is the mean over its targets (each of grad_accum slices scaled
// by 1/grad_accum), and the gradient reduction's mean over the W ranks makes the gradient that
// of the global batch's mean, since every rank trains as many targets. Fine-tuning data masks
// targets (kIgnoreIndex), so ranks and slices train different numbers of them and a mean of
// means would weigh them unequally. There each slice's loss is its summed cross-entropy times
// W / N, N the count of trained targets in the whole global batch: the reduction's mean over
// the ranks makes the gradient that of sum / N, the global mean over trained targets, and the
// reported loss, the mean over ranks of each rank's slices, is that same sum / N. Every rank
// draws the whole global batch (data.h), so N is counted locally: no collective. A batch with no
// trained target has loss 0 and no gradient (N is taken as 1).
at::Tensor masked_loss(const Run& run, const at::Tensor& logits, const at::Tensor& targets,
                       int64_t trained) {
  const double scale = double(run.world) / double(std::max<int64_t>(trained, 1));
  return run.built->summed_loss(logits, targets) * scale;
}

// The step's rate on every parameter group: the optimizer state a resume loads carries no
// schedule, the step alone decides.
double set_learning_rate(Run& run, int64_t step) {
  const double lr = lr_at(run.schedule, step);
  for (auto& group : run.optimizer->param_groups()) {
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
  }
  return lr;
}

// Forward only, no autograd graph (so FSDP runs no backward and no reduce-scatter) over
// --val-batches global batches of the held-out data, drawn from one fixed seed so every
// evaluation sees the same tokens; rank r takes its rows as in training. Returns the mean loss
// over the batches, averaged over ranks. Collective. The passes are left out of --trace.
// Fine-tuning data: the mean over every trained target of the batches, as in training.
double validation_loss(Run& run, const TokenDataset& val) {
  const JobConfig& o = run.o;
  torch::NoGradGuard no_grad;
  const bool tracing = !o.metrics.trace_dir.empty();
  run.tracer->enable(false);
  double sum = 0;
  int64_t trained = 0;
  for (int64_t b = 0; b < o.data.val_batches; ++b) {
    const auto global = val.global_batch(b, o.training.global_batch, o.training.seq_len, kValSeed);
    const auto [host_inputs, host_targets] = micro_batch(global, run.rank, run.world);
    const at::Tensor inputs = host_inputs.to(run.device);
    const at::Tensor targets = host_targets.to(run.device);
    const at::Tensor logits = run.built->forward(inputs);
    if (val.labeled()) {
      trained += trained_targets(global.second);
      sum += sum_over_ranks(run.built->summed_loss(logits, targets), run);
    } else {
      sum += mean_over_ranks(run.built->loss(logits, targets), run);
    }
  }
  run.tracer->enable(tracing);
  if (val.labeled()) return sum / static_cast<double>(std::max<int64_t>(trained, 1));
  return sum / static_cast<double>(o.data.val_batches);
}

// Every --val-every steps and after the last step, when there is held-out data.
bool validates_after(const Run& run, int64_t steps_done) {
  const JobConfig& o = run.o;
  return steps_done == o.training.steps ||
         (o.data.val_every > 0 && steps_done % o.data.val_every == 0);
}

// The whole set-up of a rank: options, data-independent state, mesh, model and optimizer.
void set_up(Run& run) {
  run.world = run.group ? run.group->size() : 1;
  run.rank = run.group ? run.group->rank() : 0;
  run.printing = run.rank == 0 && !run.o.metrics.quiet;
  run.schedule = lr_schedule_of(run.o);
  // --metrics and --tensorboard count CPU tensor bytes from here on (the corpus, loaded before,
  // is not counted).
  run.count_memory = !run.o.metrics.path.empty() || !run.o.metrics.tensorboard_dir.empty();
  if (run.count_memory) {
    install_cpu_memory_counter();
    run.count_thread.emplace(run.thread_memory);
  }
  // --trace's memory track counts every tensor of the model too.
  if (!run.o.metrics.trace_dir.empty()) install_cpu_memory_counter();
  run.spec = model_spec_of(run.o);
  build_mesh(run);
  build_model(run);
  open_outputs(run);
}

// Collective: every rank saves its shards; the checkpoint holds the state after `step` steps.
void save_checkpoint(Run& run, const TokenDataset& data, int64_t step) {
  auto options = checkpoint::SaveOptions().step(step).user_json(
      run_state_json(run.o, data, step, skipped_steps(run)));
  if (run.scaler) options.grad_scaler(run.scaler->state());
  const auto saved =
      checkpoint::save_checkpoint(run.o.checkpoint.format, run.o.checkpoint.save_dir, *run.model,
                                  run.optimizer.get(), run.group.get(), options);
  if (!run.printing) return;
  fmt::print("fsdp-train: saved {} ({:.1f} MB in {:.2f}s, {:.0f} MB/s)\n", saved.path,
             saved.bytes / 1e6, saved.seconds, saved.bytes / 1e6 / saved.seconds);
  std::fflush(stdout);
}

// --dump-batches: micro-batch k over all ranks is each rank's k-th slice of its rows, in rank
// order.
void dump_batch(Run& run, int64_t step, const std::pair<at::Tensor, at::Tensor>& global) {
  if (!run.batches.is_open()) return;
  const JobConfig& o = run.o;
  for (int64_t k = 0; k < o.training.grad_accum; ++k) {
    const auto slice_k = [&](const at::Tensor& t) {
      return t.view({run.world, o.training.grad_accum, -1, o.training.seq_len})
          .select(1, k)
          .reshape({-1, o.training.seq_len});
    };
    write_int64s(run.batches, {step + 1, k});
    write_int64s(run.batches, slice_k(global.first));
    write_int64s(run.batches, slice_k(global.second));
  }
  run.batches.flush();
  TORCH_CHECK(run.batches.good(), "cannot write --dump-batches file '", o.debug.dump_batches_path,
              "'");
}

// Resets the mesh's per-step counters and peaks.
StepProbe begin_step(Run& run) {
  StepProbe probe;
  probe.start = Clock::now();
  if (run.mesh) {
    run.mesh->reset_counters();
    run.mesh->stats().reset_peaks();
    run.mesh->stats().reset_exposed_comm();
  }
  return probe;
}

// Taken just before the first forward, after the batch is built and dumped.
void probe_before_forward(Run& run, StepProbe& probe) {
  probe.written_at_start = written_bytes();  // after the dump: sent_bytes is the step's
  process_cpu_memory().reset_peak();
  probe.live_before_forward = run.thread_memory->live_bytes();
  probe.held_before_forward = run.mesh ? run.mesh->stats().live() : MemorySnapshot{};
}

// What forward left alive is what autograd saved, apart from gathered parameters (the root's;
// every block's under shard_grad_op) and communication buffers.
int64_t activation_bytes_since(const Run& run, const StepProbe& probe) {
  int64_t bytes = run.thread_memory->live_bytes() - probe.live_before_forward;
  if (run.mesh) {
    const MemorySnapshot held = run.mesh->stats().live();
    bytes -= held.unsharded_param_bytes - probe.held_before_forward.unsharded_param_bytes;
    bytes -= held.comm_buffer_bytes - probe.held_before_forward.comm_buffer_bytes;
  }
  return bytes;
}

// Under --accum-mode no-sync / no-reshard only the last micro-batch's backward reduces; with
// no-reshard every unit stays gathered from the first forward to the last backward; with
// no-all-reduce every backward reduce-scatters and only the last all-reduces across replicas.
void set_accumulation_state(Run& run, bool last_micro_batch) {
  if (!run.root || run.o.training.accum_mode == AccumulationMode::kSync) return;
  if (run.o.training.accum_mode == AccumulationMode::kNoAllReduce) {
    run.root->set_requires_all_reduce(last_micro_batch);
    return;
  }
  run.root->set_requires_gradient_sync(last_micro_batch);
  if (run.o.training.accum_mode == AccumulationMode::kNoReshard) {
    run.root->set_reshard_after_forward(false);
    run.root->set_reshard_after_backward(last_micro_batch);
  }
}

// The rank's micro-batch runs as grad_accum slices, each loss scaled by 1/grad_accum, so the
// summed gradient is the same mean as one pass over the micro-batch. Returns the summed loss.
// trained: fine-tuning data's count of trained targets in the global batch ([Note: the mean
// over trained targets]).
at::Tensor forward_backward(Run& run, const at::Tensor& inputs, const at::Tensor& targets,
                            StepProbe& probe, bool inject_nan, std::optional<int64_t> trained) {
  const int accum = run.o.training.grad_accum;
  const int64_t slice = inputs.size(0) / accum;
  at::Tensor loss;
  for (int k = 0; k < accum; ++k) {
    set_accumulation_state(run, k == accum - 1);
    at::Tensor micro;
    {
      // The logits die here, before the activation probe and the backward: the loss keeps
      // what its backward needs, and a [B, T, V] tensor more would count (and cost) as memory.
      const at::Tensor logits = run.built->forward(inputs.narrow(0, k * slice, slice));
      const at::Tensor slice_targets = targets.narrow(0, k * slice, slice);
      micro = trained ? masked_loss(run, logits, slice_targets, *trained)
                      : run.built->loss(logits, slice_targets);
    }
    if (accum > 1 && !trained) micro = micro / accum;
    if (inject_nan) micro = micro * std::numeric_limits<double>::quiet_NaN();
    if (k == 0) probe.activation_bytes = activation_bytes_since(run, probe);
    (run.scaler ? run.scaler->scale(micro) : micro).backward();
    loss = k == 0 ? micro.detach() : loss + micro.detach();
  }
  return loss;
}

double clip_gradients(Run& run) {
  return run.mesh ? clip_grad_norm_(run.params, run.o.training.max_grad_norm, *run.mesh)
                  : torch::nn::utils::clip_grad_norm_(run.params, run.o.training.max_grad_norm);
}

void optimizer_step(Run& run) {
  TraceScope trace(*run.tracer, "compute", "optimizer step");
  if (run.scaler) {
    run.scaler->step(*run.optimizer);
  } else {
    run.optimizer->step();
  }
}

// Every rank's numbers for the step (collective: gathers them to every rank).
// tokens: what the step trained on (tokens_per_s's numerator).
StepRecord record_step(Run& run, int64_t step, double loss, double norm, const StepProbe& probe,
                       int64_t tokens) {
  RankStepStats mine;
  mine.rank = run.rank;
  if (run.count_memory) mine.activation_bytes = probe.activation_bytes;
  mine.grad_bytes = probe.grad_bytes;
  mine.sent_bytes = written_bytes() - probe.written_at_start;
  mine.peak_rss_bytes = peak_rss_bytes();
  mine.param_bytes = tensor_bytes(run.params);
  mine.optim_bytes = optimizer_bytes(*run.optimizer);
  if (run.count_memory) mine.peak_alloc_bytes = process_cpu_memory().peak_bytes();
  if (run.mesh) {
    mine.peak_unsharded_bytes = run.mesh->stats().peak_unsharded_bytes();
    const CommCounters counters = run.mesh->counters();
    mine.all_gather_bytes = counters.all_gather.payload_bytes;
    mine.reduce_scatter_bytes = counters.reduce_scatter.payload_bytes;
    mine.all_reduce_bytes = counters.all_reduce.payload_bytes;
    mine.broadcast_bytes = counters.broadcast.payload_bytes;
    mine.reduce_bytes = counters.reduce.payload_bytes;
  }
  const double step_s = std::chrono::duration<double>(Clock::now() - probe.start).count();
  run.elapsed += step_s;
  run.tokens_done += double(tokens);
  return StepRecord{step + 1,
                    loss,
                    norm,
                    tokens / step_s,
                    step_s,
                    run.mesh ? run.mesh->stats().exposed_comm_s() : 0.0,
                    gather_stats(mine, run.group.get())};
}

void write_metrics(Run& run, const StepRecord& record) {
  if (run.metrics) run.metrics->write(record);
}

void print_progress(const Run& run, const StepRecord& r) {
  const JobConfig& o = run.o;
  const bool due = r.step % o.metrics.log_every == 0 || r.step == 1 || r.step == o.training.steps;
  if (!run.printing || !(due || r.val_loss)) return;
  const int64_t done = r.step - run.first_step;
  const double eta = run.elapsed / double(done) * double(o.training.steps - r.step);
  const std::string val = r.val_loss ? fmt::format(" | val loss {:.4f}", *r.val_loss) : "";
  const std::string scale = r.loss_scale ? fmt::format(" | loss scale {:g}", *r.loss_scale) : "";
  fmt::print(
      "step {:>5}/{} | loss {:.4f}{} | lr {:.3e} | grad norm {:.3f} | {:>8.0f} tokens/s | ETA "
      "{}{}\n",
      r.step, o.training.steps, r.loss, val, r.lr, r.grad_norm, run.tokens_done / run.elapsed,
      format_duration(eta), scale);
  std::fflush(stdout);
}

void save_periodically(Run& run, const TokenDataset& data, int64_t steps_done) {
  const JobConfig& o = run.o;
  if (!o.checkpoint.save_dir.empty() && o.checkpoint.save_every > 0 &&
      steps_done % o.checkpoint.save_every == 0) {
    save_checkpoint(run, data, steps_done);
  }
}

// The final state, unless --save-every just saved it (also when no step ran: --steps 0, or a
// resume at the last step).
void save_final(Run& run, const TokenDataset& data) {
  const JobConfig& o = run.o;
  if (o.checkpoint.save_dir.empty()) return;
  if (o.checkpoint.save_every > 0 && o.training.steps > run.first_step &&
      o.training.steps % o.checkpoint.save_every == 0)
    return;
  save_checkpoint(run, data, o.training.steps);
}

void write_trace(Run& run) {
  const JobConfig& o = run.o;
  if (o.metrics.trace_dir.empty()) return;
  TORCH_CHECK(::mkdir(o.metrics.trace_dir.c_str(), 0755) == 0 || errno == EEXIST,
              "cannot create --trace directory '", o.metrics.trace_dir,
              "': ", std::strerror(errno));
  const std::string path = o.metrics.trace_dir + "/rank" + std::to_string(run.rank) + ".json";
  run.tracer->write_chrome_trace(path, run.rank);
  if (run.printing) {
    fmt::print("fsdp-train: wrote the timeline of each rank to {}/rank<N>.json\n",
               o.metrics.trace_dir);
  }
}

// The units' parameters as this rank holds them, in backward order (the last unit first), then
// the root's own (embeddings, final norm, output), for the numerics guard's report.
std::vector<UnitParams> units_in_backward_order(const Run& run) {
  std::vector<UnitParams> units;
  std::unordered_set<const void*> in_units;
  const auto built_units = run.built->units();
  for (auto it = built_units.rbegin(); it != built_units.rend(); ++it) {
    std::vector<at::Tensor> params = unique_parameters(*it->second);
    for (const auto& p : params) in_units.insert(p.unsafeGetTensorImpl());
    units.emplace_back(it->first, std::move(params));
  }
  std::vector<at::Tensor> root;
  for (const auto& p : run.params) {
    if (in_units.count(p.unsafeGetTensorImpl()) == 0) root.push_back(p);
  }
  units.emplace_back("root", std::move(root));
  return units;
}

// Whether the step may update the weights: yes when its loss and gradient norm are finite.
// Otherwise every rank (both numbers are global) reports where it went wrong, and stops, or
// skips the step while --skip-nonfinite allows.
bool step_is_finite(Run& run, int64_t step, const at::Tensor& loss, double mean_loss, double norm) {
  if (std::isfinite(mean_loss) && std::isfinite(norm)) return true;
  const std::string what =
      describe_nonfinite(step, loss, norm, units_in_backward_order(run), run.group.get());
  TORCH_CHECK(run.skipped_steps < run.o.training.skip_nonfinite, what,
              run.o.training.skip_nonfinite == 0
                  ? "; --skip-nonfinite N would skip such steps"
                  : "; stopping: --skip-nonfinite " +
                        std::to_string(run.o.training.skip_nonfinite) +
                        " steps were skipped already");
  ++run.skipped_steps;
  if (run.printing) fmt::print("fsdp-train: skipped {} (no update on any rank)\n", what);
  return false;
}

// Crash injection for the restart tests: FSDP_TRAIN_KILL_AT is a comma-separated list of
// <step>:<rank>:<marker file>. The rank kills itself with SIGKILL at the start of that (0-based)
// step unless the marker exists, creating it first, so a restarted job that runs the step again
// goes past it.
void kill_if_asked(const Run& run, int64_t step) {
  const char* value = std::getenv("FSDP_TRAIN_KILL_AT");
  if (value == nullptr) return;
  std::istringstream specs(value);
  std::string spec;
  while (std::getline(specs, spec, ',')) {
    long long s = 0, r = 0;
    char marker[4096] = {0};
    TORCH_CHECK(std::sscanf(spec.c_str(), "%lld:%lld:%4095s", &s, &r, marker) == 3,
                "FSDP_TRAIN_KILL_AT entries must be <step>:<rank>:<marker file>, got '", spec, "'");
    if (s != step || r != run.rank || ::access(marker, F_OK) == 0) continue;
    std::ofstream(marker) << "killed at step " << step << "\n";
    ::raise(SIGKILL);
  }
}

// Hang injection for the timeout tests: FSDP_TRAIN_STALL_AT=<step>:<rank> makes that rank stop
// at the start of that (0-based) step and never issue another collective, alive, as a rank
// stuck in a deadlock or a dead NFS mount would; its peers must time out naming it.
void stall_if_asked(const Run& run, int64_t step) {
  const char* value = std::getenv("FSDP_TRAIN_STALL_AT");
  if (value == nullptr) return;
  long long s = 0, r = 0;
  TORCH_CHECK(std::sscanf(value, "%lld:%lld", &s, &r) == 2,
              "FSDP_TRAIN_STALL_AT must be <step>:<rank>, got '", value, "'");
  if (s != step || r != run.rank) return;
  while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
}

// One optimizer step: forward and backward over the rank's micro-batches, clip, step; then the
// bookkeeping around it.
StepRecord train_step(Run& run, const TokenDataset& data, int64_t step) {
  const JobConfig& o = run.o;
  kill_if_asked(run, step);
  stall_if_asked(run, step);
  StepProbe probe = begin_step(run);
  const auto global =
      data.global_batch(step, o.training.global_batch, o.training.seq_len, o.training.seed);
  dump_batch(run, step, global);
  const auto [inputs, targets] = micro_batch(global, run.rank, run.world);
  // Fine-tuning data trains (and tokens_per_s counts) only the targets its labels keep.
  const std::optional<int64_t> trained =
      data.labeled() ? std::optional<int64_t>(trained_targets(global.second)) : std::nullopt;
  // Before the probe: the gradients zero_grad frees are not part of what forward keeps.
  run.optimizer->zero_grad();
  probe_before_forward(run, probe);
  const at::Tensor loss = forward_backward(run, inputs.to(run.device), targets.to(run.device),
                                           probe, nan_injected_at(step, run.rank), trained);
  if (overflow_injected_at(step, run.rank)) make_a_gradient_inf(run.params);
  const std::optional<double> loss_scale =
      run.scaler ? std::optional<double>(run.scaler->get_scale()) : std::nullopt;
  // Clipping sees the unscaled gradients.
  const bool overflow = run.scaler && run.scaler->unscale_(*run.optimizer);
  const double norm = clip_gradients(run);
  const double mean_loss = mean_over_ranks(loss, run);
  probe.grad_bytes = grad_bytes(run.params);
  const double lr = set_learning_rate(run, step);
  // An overflow at the loss scale skips the step on every rank (found_inf is global); a loss
  // that is not finite is the numerics guard's, scaler or not.
  if (overflow && std::isfinite(mean_loss)) {
    ++run.overflow_skips;
  } else if (step_is_finite(run, step, loss, mean_loss, norm)) {
    optimizer_step(run);
  }
  if (run.scaler) run.scaler->update();
  StepRecord record = record_step(run, step, mean_loss, norm, probe,
                                  trained.value_or(o.training.global_batch * o.training.seq_len));
  record.lr = lr;
  record.loss_scale = loss_scale;
  record.skipped_steps = skipped_steps(run);
  record.units = run.units;
  return record;
}

}  // namespace

TrainSummary train(const JobConfig& o, const std::shared_ptr<ProcessGroup>& group) {
  validate(o, group ? group->size() : 1);
  const Datasets data = load_datasets(o, model_spec_of(o)->vocab_size());
  Run run(o, group);
  set_up(run);
  TrainSummary summary;
  summary.unigram_entropy = unigram_entropy_of(data.train);
  print_banner(run, data.train, summary.unigram_entropy);
  load_initial_state(run);

  for (int64_t step = run.first_step; step < o.training.steps; ++step) {
    StepRecord record = train_step(run, data.train, step);
    if (data.val && validates_after(run, step + 1)) {
      record.val_loss = validation_loss(run, *data.val);
    }
    write_metrics(run, record);
    print_progress(run, record);
    summary.steps.push_back(std::move(record));
    save_periodically(run, data.train, step + 1);
  }
  save_final(run, data.train);
  export_model(run.o, *run.spec, *run.model, run.group.get(), run.printing);
  write_trace(run);
  if (run.printing && !summary.steps.empty()) {
    fmt::print("fsdp-train: final loss {:.4f} nats vs unigram entropy {:.4f} nats, {:.1f}s\n",
               summary.steps.back().loss, summary.unigram_entropy, run.elapsed);
  }
  return summary;
}

}  // namespace fsdp::train
