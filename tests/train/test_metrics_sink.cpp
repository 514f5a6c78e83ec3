// The metrics sinks (fsdp/train/metrics_sink.h): the JSON-lines sink writes one object per step
// with every field of the record, flushed at once; the TensorBoard sink makes a new event file
// named as TensorBoard names them, one record per step after the file_version record (the
// events themselves are read by TensorBoard in test_fsdp_train_tensorboard.cpp); MetricsSinks
// hands each record to every sink; an unusable path is refused naming it.
#include <fsdp/train/metrics_sink.h>

#include "support/files.h"
#include "support/test_support.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

namespace fsdp::train {
namespace {

StepRecord record(int64_t step) {
  StepRecord r;
  r.step = step;
  r.loss = 2.5 / double(step);
  r.grad_norm = 0.75;
  r.lr = 1e-3;
  r.units = 3;
  RankStepStats rank;
  rank.rank = 0;
  rank.param_bytes = 4096;
  r.ranks = {rank};
  if (step % 2 == 0) r.val_loss = 3.0;
  return r;
}

// A sink that keeps what it was given.
struct Recorder : MetricsSink {
  explicit Recorder(std::vector<int64_t>* seen) : seen_(seen) {}
  void write(const StepRecord& r) override { seen_->push_back(r.step); }
  std::vector<int64_t>* seen_;
};

TEST(MetricsSink, JsonLinesHoldEveryFieldOfEachStep) {
  const std::string path = test::temp_path("metrics.jsonl");
  JsonLinesSink sink(path);
  sink.write(record(1));
  // Flushed after each step: readable while the run goes on.
  ASSERT_EQ(test::read_json_lines(path).size(), 1u);
  sink.write(record(2));
  const auto lines = test::read_json_lines(path);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["step"], 1);
  EXPECT_DOUBLE_EQ(lines[0]["loss"].get<double>(), 2.5);
  EXPECT_DOUBLE_EQ(lines[1]["loss"].get<double>(), 1.25);
  EXPECT_EQ(lines[0]["units"], 3);
  EXPECT_DOUBLE_EQ(lines[0]["lr"].get<double>(), 1e-3);
  EXPECT_EQ(lines[0]["ranks"][0]["param_bytes"], 4096);
  EXPECT_FALSE(lines[0].contains("val_loss"));
  EXPECT_DOUBLE_EQ(lines[1]["val_loss"].get<double>(), 3.0);
  EXPECT_FALSE(lines[1].contains("loss_scale"));
  for (const char* key :
       {"grad_norm", "tokens_per_s", "step_s", "exposed_comm_s", "comm_s", "skipped_steps"})
    EXPECT_TRUE(lines[0].contains(key)) << key;
  EXPECT_EQ(nlohmann::json::parse(to_json_line(record(1))), lines[0]);
}

TEST(MetricsSink, TensorBoardWritesANewEventFilePerSink) {
  const std::string dir = test::temp_path("metrics_tb");
  test::remove_all(dir);
  TensorBoardSink first(dir);
  first.write(record(1));
  const int64_t one_step = test::file_size(first.path());
  first.write(record(2));
  EXPECT_GT(test::file_size(first.path()), one_step);
  EXPECT_EQ(first.path().rfind(dir + "/events.out.tfevents.", 0), 0u) << first.path();
  // A second sink in the same second never overwrites the first's file.
  TensorBoardSink second(dir);
  EXPECT_NE(second.path(), first.path());
  EXPECT_EQ(test::list_dir(dir).size(), 2u);
}

TEST(MetricsSink, SinksFanOutInOrderAndRefuseBadPaths) {
  std::vector<int64_t> a, b;
  MetricsSinks sinks;
  EXPECT_TRUE(sinks.empty());
  sinks.add(std::make_unique<Recorder>(&a));
  sinks.add(std::make_unique<Recorder>(&b));
  sinks.write(record(1));
  sinks.write(record(2));
  EXPECT_EQ(a, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(b, a);

  const std::string file = test::temp_path("metrics_not_a_dir");
  ASSERT_TRUE(test::write_bytes(file, "x"));
  std::string msg =
      test::error_message([&] { JsonLinesSink(file + "/m.jsonl", "--metrics file"); });
  EXPECT_NE(msg.find("cannot open --metrics file '" + file + "/m.jsonl'"), std::string::npos)
      << msg;
  msg = test::error_message([&] { TensorBoardSink(file + "/tb", "--tensorboard"); });
  EXPECT_NE(msg.find("--tensorboard: cannot create directory '" + file + "/tb'"), std::string::npos)
      << msg;
}

}  // namespace
}  // namespace fsdp::train
