// The checkpoint manager (fsdp/train/checkpoint_manager.h): the policy (when to save, which
// checkpoints stay, where a resume loads from) over checkpoint::save_checkpoint and
// load_checkpoint, which do the writing, the pruning to keep_last and the crash safety.
#include <fsdp/train/checkpoint_manager.h>

#include <c10/util/Exception.h>

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <memory>

namespace fsdp::train {
namespace {

// "step_00000100" -> 100: the names the checkpoint layer gives its step directories.
std::optional<int64_t> step_of(const std::string& name) {
  const std::string prefix = "step_";
  if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) {
    return std::nullopt;
  }
  const std::string digits = name.substr(prefix.size());
  if (digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), ::isdigit)) {
    return std::nullopt;
  }
  return std::stoll(digits);
}

}  // namespace

CheckpointManager::CheckpointManager(const CheckpointManagerOptions& options,
                                     torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                                     ProcessGroup* group)
    : options_(options), model_(model), optimizer_(optimizer), group_(group) {
  TORCH_CHECK(options_.save_every() >= 0, "CheckpointManager: save_every must be >= 0, got ",
              options_.save_every());
  TORCH_CHECK(options_.keep_last() >= 0, "CheckpointManager: keep_last must be >= 0, got ",
              options_.keep_last());
}

std::string CheckpointManager::resume_path(const std::string& resume) const {
  if (resume != "auto") return resume;
  const std::string& dir = options_.dir();
  return !dir.empty() && ::access((dir + "/latest").c_str(), F_OK) == 0 ? dir : "";
}

std::optional<checkpoint::LoadResult> CheckpointManager::load(const std::string& resume) {
  const std::string path = resume_path(resume);
  if (path.empty()) return std::nullopt;
  return checkpoint::load_checkpoint(path, model_, optimizer_, group_);
}

bool CheckpointManager::due(int64_t steps_done) const {
  return !options_.dir().empty() && options_.save_every() > 0 &&
         steps_done % options_.save_every() == 0;
}

bool CheckpointManager::final_save_due(int64_t total_steps, int64_t first_step) const {
  if (options_.dir().empty()) return false;
  return !(total_steps > first_step && due(total_steps));
}

checkpoint::SaveResult CheckpointManager::save(int64_t step, const std::string& user_json,
                                               const std::optional<GradScalerState>& grad_scaler) {
  TORCH_CHECK(!options_.dir().empty(), "CheckpointManager::save: no dir to save step ", step,
              " under");
  auto save_options =
      checkpoint::SaveOptions().step(step).user_json(user_json).keep_last(options_.keep_last());
  save_options.grad_scaler(grad_scaler);
  return checkpoint::save_checkpoint(options_.format(), options_.dir(), model_, optimizer_, group_,
                                     save_options);
}

std::vector<int64_t> CheckpointManager::saved_steps() const {
  std::vector<int64_t> steps;
  std::unique_ptr<DIR, int (*)(DIR*)> dir(::opendir(options_.dir().c_str()), &::closedir);
  if (!dir) return steps;
  while (const dirent* entry = ::readdir(dir.get())) {
    if (const auto step = step_of(entry->d_name)) steps.push_back(*step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

}  // namespace fsdp::train
