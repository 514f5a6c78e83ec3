// fsdp-train's training loop.
//
// Invariants that make a sharded run comparable to the --no-fsdp reference:
// - every process builds the same global batch for a step (fsdp/train/data_loader.h) and rank
//   r trains on rows [r*B/W, (r+1)*B/W) of it, so the ranks' micro-batches concatenated in rank
//   order are the reference's batch;
// - every parameter's initial value depends only on its name and the seed (fsdp/models/model.h), so
//   the sharded model, built and sharded unit by unit, starts where the reference starts;
// - the reported loss is the mean over ranks of the micro-batch losses, which equals the
//   reference's loss on the global batch because micro-batches have equal sizes; fine-tuning
//   data, whose ranks train different numbers of targets, scales each rank's summed loss so
//   that the same mean is the global mean over trained targets (see [Note: the mean over
//   trained targets]).
// - the learning rate of step s is lr_at(schedule, s) (fsdp/train/lr_schedule.h), set on every
//   param group before the optimizer step: no state, so a resumed run takes the same rates;
// - the held-out loss runs forward only, without autograd, after the step's numbers are taken:
//   it changes no parameter and no optimizer state, so training is bit-identical with or
//   without it, and its batches come from a fixed seed, so every evaluation sees the same ones.
//
// train() reads top to bottom: checks, model and data (each resolved and loaded once), set-up
// (Run, parallelize.h), then per step train_step() (forward and backward per micro-batch, clip,
// step) and the helpers around it (held-out loss, metrics, progress, periodic save:
// checkpointing.h), then the final save, export and trace.
#include <fsdp_train/trainer.h>

#include <fsdp/clip_grad.h>
#include <fsdp/models/model.h>
#include <fsdp/train/data_loader.h>
#include <fsdp/train/lr_schedule.h>
#include <fsdp/util/memory_counter.h>
#include <fsdp_train/checkpointing.h>
#include <fsdp_train/export.h>
#include <fsdp_train/fault_injection.h>
#include <fsdp_train/job_checks.h>
#include <fsdp_train/nonfinite.h>
#include <fsdp_train/parallelize.h>
#include <fsdp_train/progress.h>
#include <fsdp_train/run.h>
#include <fsdp_train/sources.h>
#include <fsdp_train/step_probe.h>
#include <fsdp_train/timeline.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <torch/nn/utils/clip_grad.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <unordered_set>

namespace fsdp::train {
namespace {

// The seed of the held-out batches: fixed, so that every evaluation sees the same tokens.
constexpr uint64_t kValSeed = 0x76616c;  // "val"

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
// by 1/grad_accum), and the gradient reduction's mean over the W data-parallel ranks makes the
// gradient that of the global batch's mean, since every rank trains as many targets.
// Fine-tuning data masks targets (kIgnoreIndex), so ranks and slices train different numbers of
// them and a mean of means would weigh them unequally. There each slice's loss is its summed
// cross-entropy times W / N, N the count of trained targets in the whole global batch: the
// reduction's mean over the ranks makes the gradient that of sum / N, the global mean over
// trained targets, and the reported loss, the mean over ranks of each rank's slices, is that
// same sum / N (under --tp, W is the data-parallel size: a tp group's ranks hold the same
// slice). Every rank draws the whole global batch (fsdp/train/data_loader.h), so N is counted
// locally: no collective. A batch with no trained target has loss 0 and no gradient (N is
// taken as 1).
at::Tensor masked_loss(const Run& run, const at::Tensor& logits, const at::Tensor& targets,
                       int64_t trained) {
  const double scale = double(run.data_world) / double(std::max<int64_t>(trained, 1));
  return run.built->summed_loss(logits, targets) * scale;
}

// The loader of the run's training batches, or of the held-out ones under seed.
DataLoaderOptions loader_options(const Run& run, uint64_t seed) {
  return DataLoaderOptions()
      .global_batch(run.o.training.global_batch)
      .seq_len(run.o.training.seq_len)
      .seed(seed)
      .rank(run.data_rank)
      .world_size(run.data_world);
}

// Forward only, no autograd graph (so FSDP runs no backward and no reduce-scatter) over
// --val-batches global batches of the held-out data, drawn from one fixed seed so every
// evaluation sees the same tokens; rank r takes its rows as in training. Returns the mean loss
// over the batches, averaged over ranks. Collective. The passes are left out of --trace.
// Fine-tuning data: the mean over every trained target of the batches, as in training.
double validation_loss(Run& run, const TokenDataset& val) {
  const JobConfig& o = run.o;
  const DataLoader loader(val, loader_options(run, kValSeed));
  torch::NoGradGuard no_grad;
  const bool tracing = !o.metrics.trace_dir.empty();
  run.monitor->tracer().enable(false);
  double sum = 0;
  int64_t trained = 0;
  for (int64_t b = 0; b < o.data.val_batches; ++b) {
    const Batch batch = loader.batch_at(b);
    const at::Tensor inputs = batch.inputs.to(run.device);
    const at::Tensor targets = batch.targets.to(run.device);
    const at::Tensor logits = run.built->forward(inputs);
    if (val.labeled()) {
      trained += trained_targets(batch.global_targets);
      sum += sum_over_ranks(run.built->summed_loss(logits, targets), run);
    } else {
      sum += mean_over_ranks(run.built->loss(logits, targets), run);
    }
  }
  run.monitor->tracer().enable(tracing);
  if (val.labeled()) return sum / static_cast<double>(std::max<int64_t>(trained, 1));
  return sum / static_cast<double>(o.data.val_batches);
}

// Every --val-every steps and after the last step, when there is held-out data.
bool validates_after(const Run& run, int64_t steps_done) {
  const JobConfig& o = run.o;
  return steps_done == o.training.steps ||
         (o.data.val_every > 0 && steps_done % o.data.val_every == 0);
}

// --metrics and --tensorboard, in that order.
void open_metrics_sinks(Run& run) {
  const MetricsConfig& m = run.o.metrics;
  if (!m.path.empty()) run.metrics.add(std::make_unique<JsonLinesSink>(m.path, "--metrics file"));
  if (!m.tensorboard_dir.empty()) {
    run.metrics.add(std::make_unique<TensorBoardSink>(m.tensorboard_dir, "--tensorboard"));
  }
}

// The rank's data-independent state, mesh, model and optimizer, its checkpoints, and rank 0's
// outputs.
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
  parallelize(run);
  const CheckpointConfig& c = run.o.checkpoint;
  run.checkpoints.emplace(
      CheckpointManagerOptions().dir(c.save_dir).save_every(c.save_every).format(c.format),
      *run.model, run.optimizer.get(), run.group.get());
  if (run.rank == 0) {
    open_metrics_sinks(run);
    run.batches.open(run.o);
  }
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
      TraceScope trace(run.monitor->tracer(), "compute", "loss");
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
  TraceScope trace(run.monitor->tracer(), "compute", "optimizer step");
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
  const RankStepStats mine = measure_rank(run, probe);
  const double step_s = probe.seconds_so_far();
  // Read before gather_stats, whose own collectives come after the step's end.
  const double comm_s = run.mesh ? run.mesh->counters().busy_s : 0.0;
  run.elapsed += step_s;
  run.tokens_done += double(tokens);
  StepRecord record{step + 1,
                    loss,
                    norm,
                    tokens / step_s,
                    step_s,
                    run.monitor->stats().exposed_comm_s(),
                    gather_stats(mine, run.group.get())};
  record.comm_s = comm_s;
  if (run.tp_mesh) record.tp_comm_s = run.tp_mesh->counters().waited_s;
  return record;
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

// One optimizer step: forward and backward over the rank's micro-batches, clip, step; then the
// bookkeeping around it.
StepRecord train_step(Run& run, DataLoader& loader) {
  const JobConfig& o = run.o;
  const int64_t step = loader.step();
  crash_or_stall_if_asked(step, run.rank);
  StepProbe probe = begin_step(run);
  const Batch batch = loader.next();
  run.batches.write(step, {batch.global_inputs, batch.global_targets}, run.data_world);
  const at::Tensor& inputs = batch.inputs;
  const at::Tensor& targets = batch.targets;
  // Fine-tuning data trains (and tokens_per_s counts) only the targets its labels keep.
  const std::optional<int64_t> trained =
      loader.data().labeled() ? std::optional<int64_t>(trained_targets(batch.global_targets))
                              : std::nullopt;
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
  // The optimizer state a resume loads carries no schedule: the step alone decides the rate.
  const double lr = apply_lr(*run.optimizer, run.schedule, step);
  // An overflow at the loss scale skips the step on every rank (found_inf is global); a loss
  // that is not finite is the numerics guard's, scaler or not.
  if (overflow && std::isfinite(mean_loss)) {
    ++run.overflow_skips;
  } else if (step_is_finite(run, step, loss, mean_loss, norm)) {
    optimizer_step(run);
  }
  if (run.scaler) run.scaler->update();
  // The step's tensors are freed: what the allocator keeps now is what the next step can reuse.
  probe.host_pages = run.host_pages.at_step_end();
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
  JobTokenizer tokenizer(o);
  std::shared_ptr<const models::ModelSpec> spec =
      check_job(o, group ? group->size() : 1, tokenizer);
  const Datasets data = load_datasets(o, spec->vocab_size(), tokenizer);
  Run run(o, group, std::move(spec));
  set_up(run);
  TrainSummary summary;
  summary.unigram_entropy = unigram_entropy_of(data.train);
  print_banner(run, data.train, summary.unigram_entropy);
  DataLoader loader(data.train, loader_options(run, static_cast<uint64_t>(o.training.seed)));
  load_initial_state(run, loader);
  run.host_pages.at_run_start();

  while (loader.step() < o.training.steps) {
    StepRecord record = train_step(run, loader);
    if (data.val && validates_after(run, loader.step())) {
      record.val_loss = validation_loss(run, *data.val);
    }
    run.metrics.write(record);
    print_progress(run, record);
    summary.last_step = std::move(record);
    save_periodically(run, loader, loader.step());
  }
  save_final(run, loader);
  export_model(run.o, *run.spec, *run.model, run.group.get(), run.printing);
  write_timeline(run.monitor->tracer(), o.metrics.trace_dir, run.rank, run.printing);
  print_final(run, summary);
  return summary;
}

}  // namespace fsdp::train
