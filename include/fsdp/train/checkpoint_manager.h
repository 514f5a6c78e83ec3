// A run's sharded checkpoints (fsdp/checkpoint/checkpoint.h), managed as torchtitan's
// CheckpointManager manages them: save every N steps under one directory, keep the last K,
// and resume from a given checkpoint or, under "auto", from the directory's newest one when it
// has one (so a job restarted with the same command continues where it stopped).
//
//   dir/step_00000100/...   one checkpoint per save (the format's files)
//   dir/latest              names the newest complete one
//
// What the run needs besides the model and the optimizer (the data position of
// fsdp/train/data_loader.h, the settings it must be resumed with) travels as the save's user
// JSON and comes back in the load's LoadResult::user_json. Every call that reads or writes a
// checkpoint is collective over the group: every rank calls it with the same arguments.
#pragma once

#include <fsdp/checkpoint/checkpoint.h>

#include <torch/arg.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::train {

struct CheckpointManagerOptions {
  // The root of the checkpoints. (optional) defaults to "": no saves, and no "auto" resume.
  TORCH_ARG(std::string, dir) = "";
  // Save after every save_every steps (0: only when the caller saves). (optional) defaults to 0.
  TORCH_ARG(int64_t, save_every) = 0;
  // After each save, only the newest keep_last checkpoints under dir stay (0 keeps all).
  // (optional) defaults to 2.
  TORCH_ARG(int, keep_last) = 2;
  // The layout saves are written in; loads take either. (optional) defaults to ours.
  TORCH_ARG(checkpoint::CheckpointFormat, format) = checkpoint::CheckpointFormat::kSharded;
};

class CheckpointManager {
 public:
  // model and optimizer (a torch::optim::AdamW over model's parameters, or null) are what saves
  // write and loads restore; they, and group (null: one process), must outlive the manager.
  // Throws naming the value when save_every or keep_last is negative.
  CheckpointManager(const CheckpointManagerOptions& options, torch::nn::Module& model,
                    torch::optim::Optimizer* optimizer, ProcessGroup* group);

  // Where a resume named `resume` loads from: "" for "" (a fresh start); for "auto", dir when
  // it holds a checkpoint (a `latest`), else "" (the first start of a job); otherwise resume
  // itself (a checkpoint directory, or a root whose `latest` names one).
  std::string resume_path(const std::string& resume) const;

  // Loads resume_path(resume) into the model (resharded to this run's world size) and the
  // optimizer; nullopt when that is "". Collective. Throws as checkpoint::load_checkpoint does.
  std::optional<checkpoint::LoadResult> load(const std::string& resume);

  // Whether the state after steps_done steps is one the options save: a dir, and save_every
  // dividing steps_done.
  bool due(int64_t steps_done) const;
  // Whether a run of total_steps that started at first_step still needs its final state saved
  // (a dir, and the last due() save, if any, was not of total_steps; also when no step ran).
  bool final_save_due(int64_t total_steps, int64_t first_step) const;

  // Saves the state after `step` steps as dir/step_<step>, with user_json (a JSON object) and
  // fp16's gradient scaler state, then deletes all but the newest keep_last checkpoints.
  // Collective; blocks until the checkpoint is durable on every rank.
  checkpoint::SaveResult save(int64_t step, const std::string& user_json = "{}",
                              const std::optional<GradScalerState>& grad_scaler = std::nullopt);

  // The steps of the checkpoints under dir, oldest first (none when dir does not exist).
  std::vector<int64_t> saved_steps() const;

  const CheckpointManagerOptions& options() const { return options_; }

 private:
  CheckpointManagerOptions options_;
  torch::nn::Module& model_;
  torch::optim::Optimizer* optimizer_;
  ProcessGroup* group_;
};

}  // namespace fsdp::train
