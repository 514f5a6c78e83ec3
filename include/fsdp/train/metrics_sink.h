// Where a run records each step's numbers (fsdp/train/step_record.h). A sink is anything that
// takes a StepRecord; two come with the library:
//   JsonLinesSink     one JSON object per line and step (its fields: to_json_line below)
//   TensorBoardSink   the step's scalars in a TensorBoard event file
// and MetricsSinks hands each record to every sink added to it. Both sinks flush after every
// step, so a crashed run loses at most the step it was in. Write from one rank (rank 0): the
// record already holds every rank's numbers.
#pragma once

#include <fsdp/train/step_record.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace fsdp::train {

class TensorBoardWriter;  // train/tensorboard_writer.h

class MetricsSink {
 public:
  virtual ~MetricsSink() = default;
  // Records one step; throws naming the sink's file when it cannot.
  virtual void write(const StepRecord& record) = 0;
};

// A step's JSON line, without the newline: {"step", "loss", "grad_norm", "tokens_per_s",
// "step_s", "exposed_comm_s", "lr", "skipped_steps", "units", "ranks": [{"rank",
// "param_bytes", ...every RankStepStats field}], and "val_loss" and "loss_scale" when the
// record has them}.
std::string to_json_line(const StepRecord& record);

class JsonLinesSink final : public MetricsSink {
 public:
  // Creates or truncates path. name says what the file is in messages. Throws naming both
  // when the file cannot be opened.
  explicit JsonLinesSink(const std::string& path, const std::string& name = "metrics file");
  void write(const StepRecord& record) override;

 private:
  std::string path_;
  std::ofstream out_;
};

class TensorBoardSink final : public MetricsSink {
 public:
  // Creates dir unless it exists (its parent must), and a new event file in it named as
  // TensorBoard's own writers name theirs, so `tensorboard --logdir DIR` finds it; an earlier
  // run's file in dir is never overwritten. Throws naming name, the path and the system's
  // reason when either cannot be made.
  explicit TensorBoardSink(const std::string& dir, const std::string& name = "TensorBoardSink");
  ~TensorBoardSink() override;
  // The scalars train/loss, train/lr, train/grad_norm, perf/tokens_per_s, perf/step_s,
  // memory/peak_alloc_bytes (the largest rank's), and when the record has them val/loss and
  // train/loss_scale, at the record's step.
  void write(const StepRecord& record) override;
  // The event file's path.
  const std::string& path() const;

 private:
  std::unique_ptr<TensorBoardWriter> writer_;
};

// Every sink added, written in the order added.
class MetricsSinks final : public MetricsSink {
 public:
  void add(std::unique_ptr<MetricsSink> sink) { sinks_.push_back(std::move(sink)); }
  bool empty() const { return sinks_.empty(); }
  void write(const StepRecord& record) override {
    for (const auto& sink : sinks_) sink->write(record);
  }

 private:
  std::vector<std::unique_ptr<MetricsSink>> sinks_;
};

}  // namespace fsdp::train
