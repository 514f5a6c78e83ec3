// Where rank 0 records each step's numbers (MetricsConfig): --metrics, one JSON object per line
// (its fields are documented in trainer.h and the README), and --tensorboard, the same numbers
// as TensorBoard scalars. Both are flushed after every step.
#pragma once

#include <fsdp_train/tensorboard_event.h>
#include <fsdp_train/tensorboard_writer.h>
#include <fsdp_train/trainer.h>
#include <train/job_config.h>

#include <nlohmann/json_fwd.hpp>

#include <fstream>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::train {

// A step's --metrics line.
nlohmann::json to_json(const StepRecord& record);

// A step's TensorBoard scalars: train/loss, train/lr, train/grad_norm, perf/tokens_per_s,
// perf/step_s, memory/peak_alloc_bytes (the largest rank's), and when the step has them
// val/loss and train/loss_scale (fp16).
std::vector<TensorBoardScalar> tensorboard_scalars(const StepRecord& record);

class StepMetrics {
 public:
  // Opens the outputs metrics names (none when both are empty); throws naming the flag and the
  // path when one cannot be created.
  explicit StepMetrics(const MetricsConfig& metrics);

  void write(const StepRecord& record);

 private:
  std::ofstream json_lines_;
  std::optional<TensorBoardWriter> tensorboard_;
};

}  // namespace fsdp::train
