// fsdp-train's training loop.
//
// Invariants that make a sharded run comparable to the --no-fsdp reference:
// - every process builds the same global batch for a step (data.h) and rank r trains on rows
//   [r*B/W, (r+1)*B/W) of it, so the ranks' micro-batches concatenated in rank order are the
//   reference's batch;
// - every parameter's initial value depends only on its name and the seed (models/model.h), so
//   the sharded model, built and sharded unit by unit, starts where the reference starts;
// - the reported loss is the mean over ranks of the micro-batch losses, which equals the
//   reference's loss on the global batch because micro-batches have equal sizes.
#include <fsdp_train/trainer.h>

#include <fsdp/checkpoint/checkpoint.h>
#include <fsdp/clip_grad.h>
#include <fsdp/device_mesh.h>
#include <fsdp/fully_shard.h>
#include <fsdp/util/memory_counter.h>
#include <fsdp_train/corpus.h>
#include <fsdp_train/data.h>
#include <models/model.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adamw.h>

#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>

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

nlohmann::json to_json(const StepRecord& r) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const auto& s : r.ranks) {
    ranks.push_back({{"rank", s.rank},
                     {"param_bytes", s.param_bytes},
                     {"grad_bytes", s.grad_bytes},
                     {"optim_bytes", s.optim_bytes},
                     {"peak_unsharded_bytes", s.peak_unsharded_bytes},
                     {"all_gather_bytes", s.all_gather_bytes},
                     {"reduce_scatter_bytes", s.reduce_scatter_bytes},
                     {"all_reduce_bytes", s.all_reduce_bytes},
                     {"peak_rss_bytes", s.peak_rss_bytes},
                     {"sent_bytes", s.sent_bytes},
                     {"peak_alloc_bytes", s.peak_alloc_bytes},
                     {"activation_bytes", s.activation_bytes}});
  }
  return {{"step", r.step},           {"loss", r.loss},     {"grad_norm", r.grad_norm},
          {"tokens_per_s", r.tokens_per_s}, {"step_s", r.step_s},
          {"exposed_comm_s", r.exposed_comm_s}, {"ranks", ranks}};
}

// Every rank's stats, gathered to every rank (one small all-gather per step).
std::vector<RankStepStats> gather_stats(const RankStepStats& mine, ProcessGroup* group) {
  if (group == nullptr) return {mine};
  const int world = group->size();
  const at::Tensor local = at::tensor(
      {double(mine.param_bytes), double(mine.grad_bytes), double(mine.optim_bytes),
       double(mine.peak_unsharded_bytes), double(mine.all_gather_bytes),
       double(mine.reduce_scatter_bytes), double(mine.all_reduce_bytes),
       double(mine.peak_rss_bytes), double(mine.sent_bytes), double(mine.peak_alloc_bytes),
       double(mine.activation_bytes)},
      at::kDouble);
  constexpr int kFields = 11;
  at::Tensor all = at::empty({world * kFields}, at::kDouble);
  group->all_gather_into_tensor(all, local)->wait();
  std::vector<RankStepStats> result(world);
  const double* v = all.data_ptr<double>();
  for (int r = 0; r < world; ++r) {
    const double* row = v + kFields * r;
    result[r] = {r,
                 int64_t(row[0]),
                 int64_t(row[1]),
                 int64_t(row[2]),
                 int64_t(row[3]),
                 int64_t(row[4]),
                 int64_t(row[5]),
                 int64_t(row[6]),
                 int64_t(row[7]),
                 int64_t(row[8]),
                 int64_t(row[9]),
                 int64_t(row[10])};
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

TokenDataset load_dataset(const TrainerOptions& o) {
  TokenDataset data = o.data_path.empty()
                          ? TokenDataset(std::string(default_corpus()), "the embedded corpus")
                          : TokenDataset::from_file(o.data_path);
  data.check_seq_len(o.seq_len);
  return data;
}

// What a checkpoint records about the run: the options that decide the model and the batches,
// and the data position (batches are a pure function of (seed, step), so the next step is the
// position; the rest makes a mismatch visible).
nlohmann::json trainer_json(const TrainerOptions& o) {
  return {{"model", o.model}, {"seed", o.seed}, {"global_batch", o.global_batch},
          {"seq_len", o.seq_len}, {"lr", o.lr}, {"weight_decay", o.weight_decay},
          {"max_grad_norm", o.max_grad_norm}, {"no_fsdp", o.no_fsdp},
          {"reshard_after_forward", o.reshard_after_forward}};
}

std::string run_state_json(const TrainerOptions& o, const TokenDataset& data, int64_t next_step) {
  const nlohmann::json j = {
      {"trainer", trainer_json(o)},
      {"data", {{"source", data.source()}, {"tokens", data.size()}, {"next_step", next_step},
                {"seed", o.seed}, {"global_batch", o.global_batch}, {"seq_len", o.seq_len}}}};
  return j.dump();
}

// Rank 0's note when a run resumes with settings that change the batches or the model.
void report_resume_mismatches(const TrainerOptions& o, const std::string& user_json) {
  const auto saved = nlohmann::json::parse(user_json, nullptr, false);
  if (!saved.is_object() || !saved.contains("trainer") || !saved["trainer"].is_object()) return;
  const nlohmann::json& t = saved["trainer"];
  const nlohmann::json now = trainer_json(o);
  for (const char* key : {"model", "seed", "global_batch", "seq_len", "lr", "weight_decay"}) {
    if (t.contains(key) && t[key] != now[key]) {
      fmt::print(stderr, "fsdp-train: note: the checkpoint was saved with {} = {}, this run uses {}\n",
                 key, t[key].dump(), now[key].dump());
    }
  }
}

// The byte-level data feeds token ids 0..255.
constexpr int64_t kByteVocab = 256;

}  // namespace

// --model, with --vocab-size's override (TrainerOptions::vocab_size) applied.
std::shared_ptr<const models::ModelSpec> model_spec_of(const TrainerOptions& o) {
  const auto spec = models::model_spec(o.model);
  if (o.vocab_size == 0) return spec;
  TORCH_CHECK(o.vocab_size > 0, "vocab_size must be positive, got ", o.vocab_size);
  models::SizeOverrides overrides;
  overrides.vocab_size = o.vocab_size;
  return spec->with_overrides(overrides);
}

std::optional<at::ScalarType> dtype_flag(const std::string& flag, const std::string& value) {
  if (value.empty()) return std::nullopt;
  if (value == "fp32") return at::kFloat;
  if (value == "bf16") return at::kBFloat16;
  if (value == "fp16") return at::kHalf;
  TORCH_CHECK(false, flag, " must be fp32, bf16 or fp16, got '", value, "'");
}

void validate(const TrainerOptions& o, int world) {
  // --steps 0 trains nothing: with --export it writes the initial weights.
  TORCH_CHECK(o.steps >= 0, "--steps must be non-negative, got ", o.steps);
  TORCH_CHECK(o.global_batch >= 1, "--global-batch must be at least 1, got ", o.global_batch);
  TORCH_CHECK(o.global_batch % world == 0, "--global-batch ", o.global_batch,
              " is not divisible by the number of ranks, ", world,
              ": every rank trains on an equal slice of the global batch");
  TORCH_CHECK(o.lr > 0, "--lr must be positive, got ", o.lr);
  TORCH_CHECK(o.log_every >= 1, "--log-every must be at least 1, got ", o.log_every);
  TORCH_CHECK(o.grad_accum >= 1, "--grad-accum must be at least 1, got ", o.grad_accum);
  TORCH_CHECK(o.global_batch % (int64_t(world) * o.grad_accum) == 0, "--global-batch ",
              o.global_batch, " is not divisible by ranks x --grad-accum micro-batches = ", world, " x ",
              o.grad_accum);
  TORCH_CHECK(o.accum_mode == "sync" || o.accum_mode == "no-sync" || o.accum_mode == "no-reshard",
              "--accum-mode must be sync, no-sync or no-reshard, got '", o.accum_mode, "'");
  TORCH_CHECK(o.strategy == "full_shard" || o.strategy == "shard_grad_op" ||
                  o.strategy == "no_shard" || o.strategy == "hybrid_shard",
              "--strategy must be full_shard, shard_grad_op, no_shard or hybrid_shard, got '",
              o.strategy, "'");
  TORCH_CHECK(o.reshard_after_forward >= 0, "--reshard-after-forward must be 0, 1 or a group size "
              ">= 2, got ", o.reshard_after_forward);
  TORCH_CHECK(o.reshard_after_forward <= 1 || o.strategy == "full_shard" ||
                  o.strategy == "hybrid_shard",
              "--reshard-after-forward ", o.reshard_after_forward,
              " (a group size) applies to --strategy full_shard and hybrid_shard, not ", o.strategy);
  TORCH_CHECK(o.replicate == 1 || o.strategy == "hybrid_shard", "--replicate ", o.replicate,
              " applies to --strategy hybrid_shard only, not ", o.strategy);
  TORCH_CHECK(o.replicate >= 1 && world % o.replicate == 0, "--replicate ", o.replicate,
              " does not divide the world size ", world);
  const int shard_group = o.strategy == "hybrid_shard" ? world / o.replicate : world;
  TORCH_CHECK(o.reshard_after_forward <= 1 || shard_group % o.reshard_after_forward == 0,
              "--reshard-after-forward ", o.reshard_after_forward,
              " (a group size) does not divide the shard group of ", shard_group, " ranks");
  dtype_flag("--param-dtype", o.param_dtype);
  dtype_flag("--reduce-dtype", o.reduce_dtype);
  TORCH_CHECK(!o.no_fsdp || (o.param_dtype == "fp32" && o.reduce_dtype.empty()),
              "--no-fsdp trains in fp32; --param-dtype ", o.param_dtype, " and --reduce-dtype '",
              o.reduce_dtype, "' need FSDP");
  const auto spec = model_spec_of(o);
  TORCH_CHECK(o.seq_len >= 1 && o.seq_len <= spec->max_seq_len(), "--seq-len ", o.seq_len,
              " is outside [1, ", spec->max_seq_len(), "], the positions model '", o.model,
              "' has");
  TORCH_CHECK(spec->vocab_size() >= kByteVocab, "model '", o.model, "' has vocab_size ",
              spec->vocab_size(), ", fewer than the ", kByteVocab,
              " byte-level token ids the trainer feeds");
  TORCH_CHECK(o.save_every >= 0, "--save-every must be non-negative, got ", o.save_every);
  TORCH_CHECK(o.save_every == 0 || !o.save_dir.empty(), "--save-every needs --save DIR");
  TORCH_CHECK(o.export_dtype == "fp32" || o.export_dtype == "bf16",
              "--export-dtype must be fp32 or bf16, got '", o.export_dtype, "'");
  TORCH_CHECK(o.resume_dir.empty() || o.init_from.empty(),
              "--resume and --init-from both set the weights; give one of them");
  if (!o.data_path.empty()) load_dataset(o);  // fails early on a missing or short file
}

TrainSummary train(const TrainerOptions& o, const std::shared_ptr<ProcessGroup>& group) {
  const int world = group ? group->size() : 1;
  const int rank = group ? group->rank() : 0;
  validate(o, world);
  const TokenDataset data = load_dataset(o);
  const bool printing = rank == 0 && !o.quiet;
  // --metrics counts CPU tensor bytes from here on (the corpus above is not counted).
  const bool count_memory = !o.metrics_path.empty();
  if (count_memory) install_cpu_memory_counter();
  MemoryCounter& memory = process_cpu_memory();
  // Activation bytes are counted on this (the compute) thread only: a collective's temporaries
  // on the process group's thread are not autograd's, whenever they happen to be freed.
  auto thread_memory = std::make_shared<MemoryCounter>();
  std::optional<CountAllocations> count_thread;
  if (count_memory) count_thread.emplace(thread_memory);

  const std::shared_ptr<const models::ModelSpec> spec = model_spec_of(o);
  std::optional<DeviceMesh> mesh;
  if (group) {
    const int replicate = o.strategy == "no_shard" ? world
                          : o.strategy == "hybrid_shard" ? o.replicate
                                                         : 1;
    mesh.emplace(DeviceMesh::hybrid(group, replicate));
  }
  MixedPrecisionPolicy mp_policy;
  if (o.param_dtype != "fp32") mp_policy.param_dtype(dtype_flag("--param-dtype", o.param_dtype));
  mp_policy.reduce_dtype(dtype_flag("--reduce-dtype", o.reduce_dtype));
  models::BuildOptions model_options;
  model_options.seed(o.seed);
  model_options.activation_checkpoint(o.activation_checkpoint);
  if (mesh) {
    // Deferred initialization: each unit is sharded as soon as it is built, so a rank never
    // holds more than the root's parameters plus one unit in full.
    FullyShardOptions unit_options;
    // ZeRO-2 keeps every block's parameters from its forward to its backward.
    if (o.strategy == "shard_grad_op") {
      unit_options.reshard_after_forward(false);
    } else if (o.reshard_after_forward >= 2) {
      unit_options.reshard_after_forward(o.reshard_after_forward);  // hpZ
    } else {
      unit_options.reshard_after_forward(o.reshard_after_forward == 1);
    }
    unit_options.mp_policy(mp_policy);
    // unit_options by value: the model is built after this block ends.
    model_options.on_unit_built(
        [&mesh, unit_options](const std::string&, const std::shared_ptr<torch::nn::Module>& block) {
          fully_shard(block, *mesh, unit_options);
        });
  }
  const std::unique_ptr<models::Model> built = spec->build(model_options);
  const std::shared_ptr<torch::nn::Module> model = built->root();
  std::optional<FSDPModule> root;
  if (mesh) {
    root = fully_shard(model, *mesh, FullyShardOptions().mp_policy(mp_policy));
    root->set_implicit_prefetch(o.prefetch);
  }
  // The --no-fsdp reference has no mesh; it traces its compute into a tracer of its own.
  Tracer reference_tracer;
  Tracer& tracer = mesh ? mesh->tracer() : reference_tracer;
  tracer.enable(!o.trace_dir.empty());

  const std::vector<at::Tensor> params = unique_parameters(*model);
  torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(o.lr)
                                            .betas({0.9, 0.95})
                                            .weight_decay(o.weight_decay));
  std::ofstream metrics;
  if (rank == 0 && !o.metrics_path.empty()) {
    metrics.open(o.metrics_path, std::ios::out | std::ios::trunc);
    TORCH_CHECK(metrics.good(), "cannot open --metrics file '", o.metrics_path, "' for writing");
  }
  std::ofstream batches;  // --dump-batches, format in trainer.h
  if (rank == 0 && !o.dump_batches_path.empty()) {
    batches.open(o.dump_batches_path, std::ios::out | std::ios::trunc | std::ios::binary);
    TORCH_CHECK(batches.good(), "cannot open --dump-batches file '", o.dump_batches_path,
                "' for writing");
    batches.write("FSDPBAT1", 8);
    write_int64s(batches, {o.global_batch / o.grad_accum, o.seq_len, o.grad_accum});
  }

  TrainSummary summary;
  summary.unigram_entropy = unigram_entropy_nats(
      std::string_view(reinterpret_cast<const char*>(data.tokens().data_ptr<uint8_t>()),
                       static_cast<size_t>(data.size())));
  if (printing) {
    fmt::print(
        "fsdp-train: model {} ({:.2f}M parameters), {} on {} rank{}, {} steps of {} x {} tokens, "
        "data: {} ({} bytes, unigram entropy {:.3f} nats)\n",
        o.model, spec->num_parameters() / 1e6, o.no_fsdp ? "no FSDP" : "FSDP", world,
        world == 1 ? "" : "s", o.steps, o.global_batch, o.seq_len, data.source(), data.size(),
        summary.unigram_entropy);
    std::fflush(stdout);
  }

  int64_t first_step = 0;
  if (!o.init_from.empty()) {
    checkpoint::load_full(o.init_from, *model, group.get(), spec->hf_layout());
    if (printing) fmt::print("fsdp-train: initialized from {}\n", o.init_from);
  }
  if (!o.resume_dir.empty()) {
    const checkpoint::LoadResult loaded =
        checkpoint::load_sharded(o.resume_dir, *model, &optimizer, group.get());
    first_step = loaded.step;
    TORCH_CHECK(first_step <= o.steps, "--resume ", loaded.path, " is at step ", first_step,
                ", past --steps ", o.steps, " (the total number of steps)");
    if (printing) {
      fmt::print("fsdp-train: resumed from {} at step {} (saved by {} rank{}): {:.1f} MB loaded in "
                 "{:.2f}s ({:.0f} MB/s), {:.1f} MB of it read by rank 0\n",
                 loaded.path, first_step, loaded.saved_world_size,
                 loaded.saved_world_size == 1 ? "" : "s", loaded.checkpoint_bytes / 1e6,
                 loaded.seconds, loaded.checkpoint_bytes / 1e6 / loaded.seconds,
                 loaded.bytes_read / 1e6);
      report_resume_mismatches(o, loaded.user_json);
    }
  }

  // Collective: every rank saves its shards; the checkpoint holds the state after `step` steps.
  auto save_checkpoint = [&](int64_t step) {
    const auto saved = checkpoint::save_sharded(
        o.save_dir, *model, &optimizer, group.get(),
        checkpoint::SaveOptions().step(step).user_json(run_state_json(o, data, step)));
    if (printing) {
      fmt::print("fsdp-train: saved {} ({:.1f} MB in {:.2f}s, {:.0f} MB/s)\n", saved.path,
                 saved.bytes / 1e6, saved.seconds, saved.bytes / 1e6 / saved.seconds);
      std::fflush(stdout);
    }
  };
  double elapsed = 0;
  const int64_t tokens_per_step = o.global_batch * o.seq_len;
  for (int64_t step = first_step; step < o.steps; ++step) {
    const auto start = Clock::now();
    if (mesh) mesh->reset_counters();
    if (mesh) {
      mesh->stats().reset_peaks();
      mesh->stats().reset_exposed_comm();
    }

    const auto global = data.global_batch(step, o.global_batch, o.seq_len, o.seed);
    if (batches.is_open()) {
      // Micro-batch k over all ranks: each rank's k-th slice of its rows, in rank order.
      for (int64_t k = 0; k < o.grad_accum; ++k) {
        const auto slice_k = [&](const at::Tensor& t) {
          return t.view({world, o.grad_accum, -1, o.seq_len}).select(1, k).reshape({-1, o.seq_len});
        };
        write_int64s(batches, {step + 1, k});
        write_int64s(batches, slice_k(global.first));
        write_int64s(batches, slice_k(global.second));
      }
      batches.flush();
      TORCH_CHECK(batches.good(), "cannot write --dump-batches file '", o.dump_batches_path, "'");
    }
    const int64_t written_at_start = written_bytes();  // after the dump: sent_bytes is the step's
    const auto [inputs, targets] = micro_batch(global, rank, world);
    optimizer.zero_grad();
    memory.reset_peak();
    const int64_t live_before_forward = thread_memory->live_bytes();
    const MemorySnapshot held_before_forward = mesh ? mesh->stats().live() : MemorySnapshot{};
    // The rank's micro-batch runs as grad_accum slices, each loss scaled by 1/grad_accum, so
    // the summed gradient is the same mean as one pass over the micro-batch.
    const int64_t slice = inputs.size(0) / o.grad_accum;
    at::Tensor loss;
    int64_t activation_bytes = 0;
    for (int k = 0; k < o.grad_accum; ++k) {
      const bool last = k == o.grad_accum - 1;
      if (root && o.accum_mode != "sync") {
        root->set_requires_gradient_sync(last);
        if (o.accum_mode == "no-reshard") {
          // Every unit stays gathered from the first forward to the last backward: one
          // all-gather per unit per step.
          root->set_reshard_after_forward(false);
          root->set_reshard_after_backward(last);
        }
      }
      at::Tensor micro = built->loss(built->forward(inputs.narrow(0, k * slice, slice)),
                                     targets.narrow(0, k * slice, slice));
      if (o.grad_accum > 1) micro = micro / o.grad_accum;
      if (k == 0) {
        // What forward left alive is what autograd saved, apart from gathered parameters (the
        // root's; every block's under shard_grad_op) and communication buffers.
        activation_bytes = thread_memory->live_bytes() - live_before_forward;
        if (mesh) {
          const MemorySnapshot held = mesh->stats().live();
          activation_bytes -= held.unsharded_param_bytes - held_before_forward.unsharded_param_bytes;
          activation_bytes -= held.comm_buffer_bytes - held_before_forward.comm_buffer_bytes;
        }
      }
      micro.backward();
      loss = k == 0 ? micro.detach() : loss + micro.detach();
    }
    const double norm = mesh ? clip_grad_norm_(params, o.max_grad_norm, *mesh)
                             : torch::nn::utils::clip_grad_norm_(params, o.max_grad_norm);
    RankStepStats mine;
    mine.rank = rank;
    if (count_memory) mine.activation_bytes = activation_bytes;
    mine.grad_bytes = grad_bytes(params);
    {
      TraceScope trace(tracer, "compute", "optimizer step");
      optimizer.step();
    }

    at::Tensor loss_sum = loss.detach().to(at::kDouble).reshape({1});
    if (group) group->all_reduce(loss_sum, ReduceOp::kSum)->wait();
    const double mean_loss = loss_sum.item<double>() / world;

    mine.sent_bytes = written_bytes() - written_at_start;
    mine.peak_rss_bytes = peak_rss_bytes();
    mine.param_bytes = tensor_bytes(params);
    mine.optim_bytes = optimizer_bytes(optimizer);
    if (count_memory) mine.peak_alloc_bytes = memory.peak_bytes();
    if (mesh) {
      mine.peak_unsharded_bytes = mesh->stats().peak_unsharded_bytes();
      const CommCounters counters = mesh->counters();
      mine.all_gather_bytes = counters.all_gather.payload_bytes;
      mine.reduce_scatter_bytes = counters.reduce_scatter.payload_bytes;
      mine.all_reduce_bytes = counters.all_reduce.payload_bytes;
    }
    const double step_s = std::chrono::duration<double>(Clock::now() - start).count();
    StepRecord record{step + 1,
                      mean_loss,
                      norm,
                      tokens_per_step / step_s,
                      step_s,
                      mesh ? mesh->stats().exposed_comm_s() : 0.0,
                      gather_stats(mine, group.get())};
    elapsed += step_s;

    if (metrics.is_open()) {
      metrics << to_json(record).dump() << '\n';
      metrics.flush();
    }
    if (printing && ((step + 1) % o.log_every == 0 || step == 0 || step + 1 == o.steps)) {
      const int64_t done = step + 1 - first_step;
      const double eta = elapsed / double(done) * double(o.steps - step - 1);
      fmt::print("step {:>5}/{} | loss {:.4f} | grad norm {:.3f} | {:>8.0f} tokens/s | ETA {}\n",
                 step + 1, o.steps, mean_loss, norm, tokens_per_step * done / elapsed,
                 format_duration(eta));
      std::fflush(stdout);
    }
    summary.steps.push_back(std::move(record));
    if (!o.save_dir.empty() && o.save_every > 0 && (step + 1) % o.save_every == 0) {
      save_checkpoint(step + 1);
    }
  }
  // The final state, unless --save-every just saved it (also when no step ran: --steps 0, or a
  // resume at the last step).
  if (!o.save_dir.empty() && !(o.save_every > 0 && o.steps > first_step && o.steps % o.save_every == 0)) {
    save_checkpoint(o.steps);
  }
  if (!o.export_path.empty()) {
    checkpoint::ExportOptions export_options;
    export_options.layout(spec->hf_layout());
    export_options.max_shard_bytes(o.export_max_shard_bytes);
    if (o.export_dtype == "bf16") export_options.dtype(at::kBFloat16);
    const auto exported = checkpoint::save_full(o.export_path, *model, group.get(), export_options);
    if (rank == 0) {
      // (No std::filesystem: libtorch.so exports a clashing copy of parts of it.)
      const auto slash = o.export_path.rfind('/');
      const std::string config_path =
          (slash == std::string::npos ? "" : o.export_path.substr(0, slash + 1)) + "config.json";
      std::ofstream config_file(config_path, std::ios::out | std::ios::trunc);
      config_file << spec->hf_config_json(export_options.dtype().value_or(at::kFloat));
      config_file.close();
      TORCH_CHECK(config_file.good(), "cannot write '", config_path, "'");
      if (printing) {
        fmt::print("fsdp-train: exported {} and {} ({:.1f} MB in {:.2f}s)\n", o.export_path,
                   config_path, exported.bytes / 1e6, exported.seconds);
      }
    }
  }
  if (!o.trace_dir.empty()) {
    TORCH_CHECK(::mkdir(o.trace_dir.c_str(), 0755) == 0 || errno == EEXIST,
                "cannot create --trace directory '", o.trace_dir, "': ", std::strerror(errno));
    const std::string path = o.trace_dir + "/rank" + std::to_string(rank) + ".json";
    tracer.write_chrome_trace(path, rank);
    if (printing) fmt::print("fsdp-train: wrote the timeline of each rank to {}/rank<N>.json\n", o.trace_dir);
  }
  if (printing && !summary.steps.empty()) {
    fmt::print("fsdp-train: final loss {:.4f} nats vs unigram entropy {:.4f} nats, {:.1f}s\n",
               summary.steps.back().loss, summary.unigram_entropy, elapsed);
  }
  return summary;
}

}  // namespace fsdp::train
