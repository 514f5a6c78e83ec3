// fsdp-comm-bench, run as a user runs it: launched with --nproc and under PyTorch's torchrun, on
// small sizes. The numbers themselves are timings; what is checked is everything derived from
// them: each size is nccl-tests' (the larger buffer), algbw = size / time, busbw = algbw times
// nccl-tests' factor for the collective and W, and the alpha-beta fit equals the relative-error
// least-squares fit recomputed here from the reported points.
#include "support/test_support.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <map>
#include <string>
#include <vector>

namespace fsdp::test {
namespace {

using ::testing::HasSubstr;

constexpr char kSmall[] = " --min-bytes 1K --max-bytes 64K --iters 3 --warmup 1";

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

double expected_bus_factor(const std::string& collective, int w) {
  if (collective == "all_reduce") return 2.0 * (w - 1) / w;
  if (collective == "broadcast" || collective == "reduce") return 1.0;
  return static_cast<double>(w - 1) / w;  // all-gather and both reduce-scatters
}

// Every derived number of a run's JSON, for world size w.
void check_report(const nlohmann::json& report, int w) {
  ASSERT_TRUE(report.is_object()) << "not JSON";
  EXPECT_EQ(report["backend"], "gloo");
  EXPECT_EQ(report["world_size"], w);
  EXPECT_EQ(report["dtype"], "fp32");
  const std::vector<std::string> collectives = {
      "all_gather", "reduce_scatter", "reduce_scatter_c10d", "all_reduce", "broadcast", "reduce"};
  const std::vector<int64_t> sizes = {1024, 4096, 16384, 65536};
  ASSERT_EQ(report["results"].size(), collectives.size() * sizes.size());
  std::map<std::string, std::vector<std::pair<double, double>>> points;
  size_t i = 0;
  for (const auto& c : collectives) {
    for (int64_t size : sizes) {
      const auto& m = report["results"][i++];
      SCOPED_TRACE(c + " " + std::to_string(size));
      EXPECT_EQ(m["collective"], c);
      // 1 KiB..64 KiB of fp32 divide into whole elements per rank for W = 2 and 4.
      EXPECT_EQ(m["size_bytes"].get<int64_t>(), size);
      EXPECT_GE(m["iters"].get<int>(), 1);
      EXPECT_LE(m["iters"].get<int>(), 3);
      const double t = m["time_s"];
      ASSERT_GT(t, 0);
      ASSERT_LT(t, 10);
      const double algbw = m["algbw_gbs"], busbw = m["busbw_gbs"];
      EXPECT_NEAR(algbw, size / t / 1e9, 1e-12 * algbw + 1e-15);
      EXPECT_NEAR(busbw, algbw * expected_bus_factor(c, w), 1e-12 * busbw + 1e-15);
      points[c].push_back({static_cast<double>(size), t});
    }
  }
  // The fit minimizes sum ((alpha + beta x - y) / y)^2: recomputed here from the normal
  // equations of that weighted problem (the program uses weighted centering, so a mistake in
  // either shows).
  for (const auto& [c, xy] : points) {
    SCOPED_TRACE(c);
    double s0 = 0, s1 = 0, s2 = 0, t0 = 0, t1 = 0;  // sums of w, w x, w x^2, w y, w x y
    for (const auto& [x, y] : xy) {
      const double w = 1 / (y * y);
      s0 += w, s1 += w * x, s2 += w * x * x, t0 += w * y, t1 += w * x * y;
    }
    const double det = s0 * s2 - s1 * s1;
    const double alpha = (t0 * s2 - s1 * t1) / det, beta = (s0 * t1 - s1 * t0) / det;
    const double my = t0 / s0;
    const auto& fit = report["fit"][c];
    ASSERT_TRUE(fit.is_object()) << "no fit for " << c;
    EXPECT_NEAR(fit["beta_s_per_byte"].get<double>(), beta, 1e-9 * std::abs(beta) + 1e-18);
    EXPECT_NEAR(fit["alpha_s"].get<double>(), alpha, 1e-9 * std::abs(my) + 1e-15);
    EXPECT_EQ(fit["points"], xy.size());
    double worst = 0;
    for (const auto& [x, y] : xy) worst = std::max(worst, std::abs(alpha + beta * x - y) / y);
    EXPECT_NEAR(fit["max_rel_error"].get<double>(), worst, 1e-6 * worst + 1e-12);
    // The points the line was fitted to travel with it, for fsdp-plan: the results' own.
    ASSERT_EQ(fit["measured"].size(), xy.size());
    for (size_t i = 0; i < xy.size(); ++i) {
      EXPECT_EQ(fit["measured"][i][0].get<double>(), xy[i].first);
      EXPECT_EQ(fit["measured"][i][1].get<double>(), xy[i].second);
    }
  }
}

TEST(CommBench, LocalRanksReportNcclTestsColumnsAndTheirFit) {
  const std::string out = temp_path("comm_bench_w2.json");
  const CommandResult r = run_command(
      program_path("fsdp-comm-bench") + " --nproc 2" + kSmall + " --output " + out, 120);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("algbw GB/s"));
  EXPECT_THAT(r.output, HasSubstr("busbw GB/s"));
  EXPECT_THAT(r.output, HasSubstr("reduce_scatter_c10d"));
  EXPECT_THAT(r.output, HasSubstr("alpha-beta fit"));
  check_report(read_json(out), 2);
}

TEST(CommBench, UnderTorchrunEachProcessIsOneRank) {
  const std::string python = reference_python();
  const std::string torchrun = python.substr(0, python.rfind('/')) + "/torchrun";
  const std::string out = temp_path("comm_bench_torchrun.json");
  const CommandResult r =
      run_command(torchrun + " --standalone --nproc-per-node 4 " + "--no-python " +
                      program_path("fsdp-comm-bench") + kSmall + " --output " + out,
                  180);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  check_report(read_json(out), 4);
}

}  // namespace
}  // namespace fsdp::test
