// fsdp-train --tensorboard DIR against TensorBoard's own reader: a short run writes both
// --metrics and --tensorboard, tests/tools/tensorboard_scalars.py reads the event file with
// TensorBoard's EventFileLoader and EventAccumulator (which check every record's CRC-32C), and
// every scalar's step and value must be the --metrics line's, rounded to float32 as TensorBoard
// stores it. The file: named as TensorBoard names event files, the file_version event first,
// then one event per step. With fp16, train/loss_scale too. Without the tensorboard package the
// test fails, saying how to install it.
#include "support/checkpoint_util.h"
#include "support/test_support.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#ifndef FSDP_SOURCE_DIR
#error "tests/CMakeLists.txt defines FSDP_SOURCE_DIR"
#endif

namespace fsdp::test {
namespace {

using ::testing::HasSubstr;

// Steps (1-based, as --metrics numbers them) and value, per tag.
using Scalars = std::map<std::string, std::map<int64_t, float>>;

// TensorBoard's reading of dir, as tensorboard_scalars.py prints it.
nlohmann::json read_with_tensorboard(const std::string& dir) {
  const CommandResult r = run_command(
      reference_python() + " " FSDP_SOURCE_DIR "/tests/tools/tensorboard_scalars.py " + dir, 120);
  EXPECT_EQ(r.exit_code, 0) << r.output
                            << "\n(tensorboard comes from scripts/requirements-test.txt: "
                            << "bash scripts/run.sh test installs it into .venv)";
  if (r.exit_code != 0) return nullptr;
  const size_t start = r.output.find("{\"files\"");
  EXPECT_NE(start, std::string::npos) << r.output;
  return start == std::string::npos ? nullptr : nlohmann::json::parse(r.output.substr(start));
}

// What the --metrics lines say each tag must hold: the step's numbers as float32, the memory
// peak the largest rank's.
Scalars expected_scalars(const std::vector<nlohmann::json>& lines) {
  Scalars want;
  for (const nlohmann::json& line : lines) {
    const int64_t step = line["step"];
    auto put = [&](const std::string& tag, double v) { want[tag][step] = static_cast<float>(v); };
    put("train/loss", line["loss"]);
    put("train/lr", line["lr"]);
    put("train/grad_norm", line["grad_norm"]);
    put("perf/tokens_per_s", line["tokens_per_s"]);
    put("perf/step_s", line["step_s"]);
    int64_t peak = 0;
    for (const auto& rank : line["ranks"]) peak = std::max<int64_t>(peak, rank["peak_alloc_bytes"]);
    put("memory/peak_alloc_bytes", static_cast<double>(peak));
    if (line.contains("val_loss")) put("val/loss", line["val_loss"]);
    if (line.contains("loss_scale")) put("train/loss_scale", line["loss_scale"]);
  }
  return want;
}

Scalars tensorboard_scalars(const nlohmann::json& read) {
  Scalars got;
  for (const auto& [tag, points] : read["scalars"].items()) {
    for (const auto& p : points) got[tag][p[0].get<int64_t>()] = p[1].get<float>();
  }
  return got;
}

// Runs fsdp-train with --metrics and --tensorboard, and checks TensorBoard's reading of the
// event file against the metrics; returns the tags TensorBoard found.
std::vector<std::string> expect_tensorboard_matches_metrics(const std::string& name,
                                                            const std::string& flags,
                                                            int64_t steps) {
  const std::string dir = temp_dir(name);
  const std::string metrics = dir + "/metrics.jsonl", events = dir + "/tb";
  const CommandResult train =
      run_fsdp_train("--quiet --global-batch 4 --seq-len 16 --steps " + std::to_string(steps) +
                     " " + flags + " --metrics " + metrics + " --tensorboard " + events);
  EXPECT_EQ(train.exit_code, 0) << train.output;
  const nlohmann::json read = read_with_tensorboard(events);
  if (read.is_null()) return {};
  // TensorBoard's name: events.out.tfevents.<unix seconds>.<hostname>.
  EXPECT_TRUE(std::regex_match(read["files"][0].get<std::string>(),
                               std::regex(R"(events\.out\.tfevents\.\d{10}\..+)")))
      << read["files"];
  // The file_version event first, then one event per step, in order: a record whose CRC-32C
  // TensorBoard rejected would end the list early.
  const auto& list = read["events"];
  EXPECT_EQ(list.size(), static_cast<size_t>(steps + 1)) << list;
  if (list.size() != static_cast<size_t>(steps + 1)) return {};
  EXPECT_EQ(list[0]["file_version"], "brain.Event:2");
  EXPECT_TRUE(list[0]["tags"].empty());
  for (int64_t s = 1; s <= steps; ++s) {
    EXPECT_EQ(list[s]["step"], s);
    EXPECT_GE(list[s]["wall_time"].get<double>(), list[s - 1]["wall_time"].get<double>());
  }
  EXPECT_GT(list[0]["wall_time"].get<double>(), 1.6e9);  // seconds since 1970, not 0
  const Scalars want = expected_scalars(read_json_lines(metrics));
  const Scalars got = tensorboard_scalars(read);
  EXPECT_EQ(got, want);
  std::vector<std::string> tags;
  for (const auto& [tag, points] : got) tags.push_back(tag);
  return tags;
}

TEST(TensorBoardTrain, ScalarsMatchTheMetricsLinesWithValidation) {
  const auto tags = expect_tensorboard_matches_metrics(
      "tensorboard_val", "--nproc 2 --val-every 2 --val-batches 1", 3);
  EXPECT_EQ(tags,
            (std::vector<std::string>{"memory/peak_alloc_bytes", "perf/step_s", "perf/tokens_per_s",
                                      "train/grad_norm", "train/loss", "train/lr", "val/loss"}));
}

TEST(TensorBoardTrain, Fp16AddsTheLossScale) {
  const auto tags =
      expect_tensorboard_matches_metrics("tensorboard_fp16", "--nproc 1 --param-dtype fp16", 2);
  EXPECT_THAT(tags, ::testing::Contains("train/loss_scale"));
}

// A directory that cannot be made is refused before training, naming the flag, the path and
// why. (As root, which CI is, a directory without write permission cannot be shown refused:
// access() grants root everything.)
TEST(TensorBoardTrain, AnUnusableDirectoryIsRefusedAtStart) {
  const std::string dir = temp_dir("tensorboard_bad");
  write_bytes(dir + "/file", "not a directory");
  const CommandResult r =
      run_fsdp_train("--nproc 1 --steps 1 --tensorboard " + dir + "/file/events", 60);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("--tensorboard"));
  EXPECT_THAT(r.output, HasSubstr(dir + "/file"));
  EXPECT_THAT(r.output, HasSubstr("is not a directory"));
}

}  // namespace
}  // namespace fsdp::test
