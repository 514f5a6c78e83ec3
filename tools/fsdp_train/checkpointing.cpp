// The trainer's checkpoints (checkpointing.h), through the run's CheckpointManager
// (fsdp/train/checkpoint_manager.h). A checkpoint's user JSON records the options that decide
// the model and the batches, and the loader's position (DataLoader::state_json): batches are a
// pure function of (seed, step), so the next step is the position and the rest makes a mismatch
// visible. A resume refuses other data or another schedule (it would not continue the run);
// rank 0 notes other model or batch settings, which fsdp-train allows (the loader then seeks to
// the checkpoint's step rather than load a state saved with other settings).
#include <fsdp_train/checkpointing.h>

#include <fsdp/checkpoint/checkpoint.h>
#include <fsdp/train/checkpoint_manager.h>

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <string>

namespace fsdp::train {
namespace {

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

// What a checkpoint records about the run's settings.
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

std::string run_state_json(const JobConfig& o, const DataLoader& loader, int64_t skipped_steps) {
  const nlohmann::json j = {{"trainer", trainer_json(o)},
                            {"skipped_steps", skipped_steps},
                            {"data", nlohmann::json::parse(loader.state_json())}};
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

void print_resumed(const Run& run, const checkpoint::LoadResult& loaded) {
  fmt::print(
      "fsdp-train: resumed from {} at step {} (saved by {} rank{}): {:.1f} MB loaded in "
      "{:.2f}s ({:.0f} MB/s), {:.1f} MB of it read by rank 0\n",
      loaded.path, run.first_step, loaded.saved_world_size, loaded.saved_world_size == 1 ? "" : "s",
      loaded.checkpoint_bytes / 1e6, loaded.seconds, loaded.checkpoint_bytes / 1e6 / loaded.seconds,
      loaded.bytes_read / 1e6);
}

// Collective: every rank saves its shards; the checkpoint holds the state after `step` steps,
// where the loader stands.
void save_checkpoint(Run& run, const DataLoader& loader, int64_t step) {
  TORCH_INTERNAL_ASSERT(loader.step() == step, "the loader is at step ", loader.step(),
                        ", the checkpoint holds step ", step);
  std::optional<GradScalerState> scaler;
  if (run.scaler) scaler = run.scaler->state();
  const auto saved =
      run.checkpoints->save(step, run_state_json(run.o, loader, skipped_steps(run)), scaler);
  if (!run.printing) return;
  fmt::print("fsdp-train: saved {} ({:.1f} MB in {:.2f}s, {:.0f} MB/s)\n", saved.path,
             saved.bytes / 1e6, saved.seconds, saved.bytes / 1e6 / saved.seconds);
  std::fflush(stdout);
}

}  // namespace

void load_initial_state(Run& run, DataLoader& loader) {
  const JobConfig& o = run.o;
  if (!o.model.init_from.empty()) {
    checkpoint::load_full(o.model.init_from, *run.model, run.group.get(), run.spec->hf_layout());
    if (run.printing) fmt::print("fsdp-train: initialized from {}\n", o.model.init_from);
  }
  if (o.checkpoint.resume == "auto" && run.checkpoints->resume_path("auto").empty() &&
      run.printing) {
    fmt::print("fsdp-train: --resume auto: no checkpoint in {} yet; starting fresh\n",
               o.checkpoint.save_dir);
  }
  const auto loaded = run.checkpoints->load(o.checkpoint.resume);
  if (!loaded) return;
  check_resume_compatible(o, loaded->user_json);
  restore_grad_scaler(run, *loaded);
  run.first_step = loaded->step;
  TORCH_CHECK(run.first_step <= o.training.steps, "--resume ", loaded->path, " is at step ",
              run.first_step, ", past --steps ", o.training.steps, " (the total number of steps)");
  loader.seek(run.first_step);
  if (!run.printing) return;
  print_resumed(run, *loaded);
  report_resume_mismatches(o, loaded->user_json);
}

void save_periodically(Run& run, const DataLoader& loader, int64_t steps_done) {
  if (run.checkpoints->due(steps_done)) save_checkpoint(run, loader, steps_done);
}

void save_final(Run& run, const DataLoader& loader) {
  if (run.checkpoints->final_save_due(run.o.training.steps, run.first_step)) {
    save_checkpoint(run, loader, run.o.training.steps);
  }
}

}  // namespace fsdp::train
