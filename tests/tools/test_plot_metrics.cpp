// scripts/plot_metrics.py on a real fsdp-train --metrics file (2 ranks, held-out loss): it
// writes the three PNGs, each a real image of the size the script asks matplotlib for, and a
// file that is not fsdp-train's metrics fails naming the file and line. Likewise
// scripts/plot_trace_memory.py on a real --trace file's memory counter track.
#include "support/checkpoint_util.h"
#include "support/test_support.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <string>

#ifndef FSDP_SOURCE_DIR
#error "tests/CMakeLists.txt defines FSDP_SOURCE_DIR"
#endif

namespace fsdp::test {
namespace {

using ::testing::HasSubstr;

std::string plot_command(const std::string& metrics, const std::string& out) {
  return reference_python() + " " FSDP_SOURCE_DIR "/scripts/plot_metrics.py " + metrics + " " + out;
}

// Width and height from a PNG's IHDR chunk, or {0, 0} when the bytes are not a PNG.
std::pair<uint32_t, uint32_t> png_size(const std::string& bytes) {
  const std::string magic = "\x89PNG\r\n\x1a\n";
  if (bytes.size() < 24 || bytes.compare(0, 8, magic) != 0 || bytes.compare(12, 4, "IHDR") != 0)
    return {0, 0};
  auto be32 = [&](size_t at) {
    uint32_t v = 0;
    for (size_t i = 0; i < 4; ++i) v = v << 8 | static_cast<uint8_t>(bytes[at + i]);
    return v;
  };
  return {be32(16), be32(20)};
}

TEST(PlotMetrics, DrawsLossThroughputAndMemoryFromARealRun) {
  const std::string dir = temp_dir("plot_metrics");
  const std::string metrics = dir + "/metrics.jsonl";
  const CommandResult train =
      run_command(fsdp_train_binary() + " --nproc 2 --steps 4 --global-batch 4 --seq-len 16 " +
                  "--quiet --val-every 2 --val-batches 1 --metrics " + metrics);
  ASSERT_EQ(train.exit_code, 0) << train.output;
  const CommandResult r = run_command(plot_command(metrics, dir + "/plots"), 120);
  ASSERT_EQ(r.exit_code, 0) << r.output
                            << "\n(matplotlib comes from scripts/requirements-test.txt: "
                            << "bash scripts/run.sh test installs it into .venv)";
  // 100 dpi: loss and throughput 8 x 4.5 inches; memory at least 8 inches wide.
  const std::pair<uint32_t, uint32_t> want = {800, 450};
  for (const char* name : {"loss.png", "throughput.png", "memory.png"}) {
    SCOPED_TRACE(name);
    EXPECT_THAT(r.output, HasSubstr(dir + "/plots/" + name));
    const std::string png = read_bytes(dir + "/plots/" + name);
    EXPECT_EQ(png_size(png), want);
    EXPECT_GT(png.size(), 10000u) << "an almost empty image";
  }
}

TEST(PlotMetrics, DrawsTheTraceMemoryTrack) {
  const std::string dir = temp_dir("plot_trace_memory");
  const CommandResult train =
      run_command(fsdp_train_binary() + " --nproc 2 --steps 2 --global-batch 4 --seq-len 16 " +
                  "--quiet --trace " + dir + "/trace");
  ASSERT_EQ(train.exit_code, 0) << train.output;
  const std::string script =
      reference_python() + " " FSDP_SOURCE_DIR "/scripts/plot_trace_memory.py ";
  const CommandResult r =
      run_command(script + dir + "/trace/rank1.json " + dir + "/memory.png --steps 1", 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string png = read_bytes(dir + "/memory.png");
  EXPECT_EQ(png_size(png), (std::pair<uint32_t, uint32_t>{1000, 450}));
  EXPECT_GT(png.size(), 10000u) << "an almost empty image";
  // A trace without the track (an empty trace here) is refused, naming the track.
  std::ofstream(dir + "/empty.json") << "{\"traceEvents\": []}";
  const CommandResult bad = run_command(script + dir + "/empty.json " + dir + "/x.png", 60);
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_THAT(bad.output, HasSubstr("has no 'memory (bytes)' counter track"));
}

TEST(PlotMetrics, ABadLineIsNamed) {
  const std::string dir = temp_dir("plot_metrics_bad");
  std::ofstream(dir + "/bad.jsonl") << "{\"step\": 1, \"loss\": 5.0}\n{\"step\": 2, \"loss\": \n";
  CommandResult r = run_command(plot_command(dir + "/bad.jsonl", dir + "/plots"), 60);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("bad.jsonl:2: not JSON"));
  std::ofstream(dir + "/other.jsonl") << "{\"loss\": 5.0}\n";
  r = run_command(plot_command(dir + "/other.jsonl", dir + "/plots"), 60);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("other.jsonl:1: no 'step'"));
}

}  // namespace
}  // namespace fsdp::test
