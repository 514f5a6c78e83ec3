// The trainer's checkpoints (checkpointing.h). A checkpoint's user JSON records the options that
// decide the model and the batches, and the data position: batches are a pure function of
// (seed, step), so the next step is the position and the rest makes a mismatch visible. A resume
// refuses other data or another schedule (it would not continue the run); rank 0 notes other
// model or batch settings.
#include <fsdp_train/checkpointing.h>

#include <fsdp/checkpoint/checkpoint.h>

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <unistd.h>
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

void print_resumed(const Run& run, const checkpoint::LoadResult& loaded) {
  fmt::print(
      "fsdp-train: resumed from {} at step {} (saved by {} rank{}): {:.1f} MB loaded in "
      "{:.2f}s ({:.0f} MB/s), {:.1f} MB of it read by rank 0\n",
      loaded.path, run.first_step, loaded.saved_world_size, loaded.saved_world_size == 1 ? "" : "s",
      loaded.checkpoint_bytes / 1e6, loaded.seconds, loaded.checkpoint_bytes / 1e6 / loaded.seconds,
      loaded.bytes_read / 1e6);
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

}  // namespace

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
  print_resumed(run, loaded);
  report_resume_mismatches(o, loaded.user_json);
}

void save_periodically(Run& run, const TokenDataset& data, int64_t steps_done) {
  const JobConfig& o = run.o;
  if (!o.checkpoint.save_dir.empty() && o.checkpoint.save_every > 0 &&
      steps_done % o.checkpoint.save_every == 0) {
    save_checkpoint(run, data, steps_done);
  }
}

void save_final(Run& run, const TokenDataset& data) {
  const JobConfig& o = run.o;
  if (o.checkpoint.save_dir.empty()) return;
  if (o.checkpoint.save_every > 0 && o.training.steps > run.first_step &&
      o.training.steps % o.checkpoint.save_every == 0)
    return;
  save_checkpoint(run, data, o.training.steps);
}

}  // namespace fsdp::train
