// The CUDA stream schedule as data: every built schedule passes the checker, and each class of
// bug the checker exists for, planted in a sound schedule, is reported naming its unit and op.
// No GPU is involved: these check the schedule's logic, not a CUDA run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "fsdp/runtime/stream_schedule.h"

namespace fsdp {
namespace {

ScheduleOptions options(int units, int prefetch, bool reshard, bool hsdp) {
  ScheduleOptions o;
  o.units = units;
  o.prefetch = prefetch;
  o.reshard_after_forward = reshard;
  o.hsdp = hsdp;
  return o;
}

ScheduleOp& find(StreamSchedule& s, ScheduleOpKind kind, int unit) {
  auto it = std::find_if(s.ops.begin(), s.ops.end(),
                         [&](const ScheduleOp& op) { return op.kind == kind && op.unit == unit; });
  EXPECT_NE(it, s.ops.end());
  return *it;
}

bool mentions(const std::vector<std::string>& violations, const std::string& a,
              const std::string& b) {
  return std::any_of(violations.begin(), violations.end(), [&](const std::string& v) {
    return v.find(a) != std::string::npos && v.find(b) != std::string::npos;
  });
}

std::string joined(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += s + "\n";
  return out;
}

TEST(StreamSchedule, EveryConfigurationPassesTheChecker) {
  for (int units : {1, 3, 8}) {
    for (int prefetch : {0, 1, 2}) {
      for (bool reshard : {true, false}) {
        for (bool hsdp : {false, true}) {
          const auto s = build_stream_schedule(options(units, prefetch, reshard, hsdp));
          const auto v = check_schedule(s);
          EXPECT_TRUE(v.empty()) << units << " units, prefetch " << prefetch << ", reshard "
                                 << reshard << ", hsdp " << hsdp << ":\n"
                                 << joined(v);
        }
      }
    }
  }
}

TEST(StreamSchedule, PrefetchDepthBoundsTheGatheredBuffers) {
  EXPECT_EQ(peak_gathered(build_stream_schedule(options(8, 0, true, false))), 1);
  EXPECT_EQ(peak_gathered(build_stream_schedule(options(8, 1, true, false))), 2);
  EXPECT_EQ(peak_gathered(build_stream_schedule(options(8, 2, true, false))), 3);
  EXPECT_EQ(peak_unsharded(build_stream_schedule(options(8, 1, true, false))), 1);
  EXPECT_EQ(peak_unsharded(build_stream_schedule(options(8, 1, false, false))), 8);
}

// The runtime's issue order, read from param_group.cpp: each pre_forward prefetches the next
// unit; each pre_backward the unit before; the third reduce-scatter completes the first.
TEST(StreamSchedule, CollectiveOrderFollowsTheRuntime) {
  const auto order = collective_order(build_stream_schedule(options(3, 1, true, true)));
  const std::vector<std::string> expected = {"all_gather 0", "all_gather 1",     "all_gather 2",
                                             "all_gather 2", "all_gather 1",     "reduce_scatter 2",
                                             "all_gather 0", "reduce_scatter 1", "reduce_scatter 0",
                                             "all_reduce 2", "all_reduce 1",     "all_reduce 0"};
  EXPECT_EQ(order, expected);
}

// [Note: HSDP's all-reduce runs beside the next units' backward]: of 5 units, unit 4's
// all-reduce is issued when its reduce-scatter completes (in unit 2's post-backward), runs
// beside the backward of units 1 and 0, and compute waits for it only at the end of backward,
// once every all-reduce is issued.
TEST(StreamSchedule, HsdpAllReduceRunsBesideTheNextUnitsBackward) {
  auto s = build_stream_schedule(options(5, 1, true, true));
  auto index = [&](ScheduleOpKind kind, int unit) { return &find(s, kind, unit) - s.ops.data(); };
  EXPECT_LT(index(ScheduleOpKind::kReduceScatter, 2), index(ScheduleOpKind::kAllReduce, 4));
  EXPECT_LT(index(ScheduleOpKind::kAllReduce, 4), index(ScheduleOpKind::kBackward, 1));
  EXPECT_LT(index(ScheduleOpKind::kBackward, 0), index(ScheduleOpKind::kFinishReduce, 4));
  EXPECT_LT(index(ScheduleOpKind::kAllReduce, 0), index(ScheduleOpKind::kFinishReduce, 4));
  EXPECT_EQ(find(s, ScheduleOpKind::kFinishReduce, 4).waits,
            std::vector<std::string>{"all_reduced[4]"});
  EXPECT_TRUE(check_schedule(s).empty()) << joined(check_schedule(s));
}

// The packed gradients freed on compute right after packing, while the reduce-scatter stream
// may not have read them yet.
TEST(StreamSchedule, CatchesAFreeBeforeItsLastReader) {
  auto s = build_stream_schedule(options(3, 1, true, false));
  find(s, ScheduleOpKind::kFinishReduce, 1).frees.clear();
  find(s, ScheduleOpKind::kRsCopyIn, 1).frees.push_back("rs_in[1]");
  const auto v = check_schedule(s);
  EXPECT_TRUE(mentions(v, "unit 1: rs_copy_in[1] on compute frees 'rs_in[1]'",
                       "reduce_scatter[1] on reduce-scatter"))
      << joined(v);
}

TEST(StreamSchedule, CatchesADroppedEventWait) {
  auto s = build_stream_schedule(options(3, 1, true, false));
  find(s, ScheduleOpKind::kCopyOut, 2).waits.clear();
  const auto v = check_schedule(s);
  EXPECT_TRUE(mentions(v, "unit 2: copy_out[2] on compute reads 'ag_buf[2]@fwd'", "no write"))
      << joined(v);
}

TEST(StreamSchedule, CatchesAWaitOnAnEventRecordedLater) {
  auto s = build_stream_schedule(options(3, 1, true, false));
  find(s, ScheduleOpKind::kCopyIn, 0).waits.push_back("rs_copied_in[2]");
  const auto v = check_schedule(s);
  EXPECT_TRUE(mentions(v, "unit 0: copy_in[0] on copy-in waits on event 'rs_copied_in[2]'",
                       "recorded later"))
      << joined(v);
}

TEST(StreamSchedule, CatchesThreeReduceScattersInFlight) {
  auto o = options(8, 1, true, false);
  o.reduces_in_flight = 3;
  const auto v = check_schedule(build_stream_schedule(o));
  EXPECT_TRUE(
      mentions(v, "unit 4: reduce_scatter[4] on reduce-scatter is issued with 3", "units 7 6 5"))
      << joined(v);
}

// The reduce-scatter input freed by the stream that last read it, not the one that allocated it:
// what record_stream would be needed for.
TEST(StreamSchedule, CatchesAFreeOnTheWrongStream) {
  auto s = build_stream_schedule(options(3, 1, true, false));
  find(s, ScheduleOpKind::kReduceScatter, 2).frees.push_back("rs_in[2]");
  find(s, ScheduleOpKind::kFinishReduce, 2).frees.clear();
  const auto v = check_schedule(s);
  EXPECT_TRUE(mentions(v, "unit 2: reduce_scatter[2] on reduce-scatter frees 'rs_in[2]'",
                       "allocated on compute"))
      << joined(v);
}

// The step's first copy-in reads shards the optimizer wrote on compute.
TEST(StreamSchedule, CatchesACopyInNotOrderedAfterTheStepBegin) {
  auto s = build_stream_schedule(options(3, 1, true, false));
  EXPECT_EQ(find(s, ScheduleOpKind::kBeginStep, -1).record, "step_begin");
  ScheduleOp& copy_in = find(s, ScheduleOpKind::kCopyIn, 0);
  ASSERT_EQ(copy_in.waits, std::vector<std::string>{"step_begin"});
  copy_in.waits.clear();
  const auto v = check_schedule(s);
  EXPECT_TRUE(mentions(v, "unit 0: copy_in[0] on copy-in reads 'shard[0]'", "begin_step"))
      << joined(v);
  EXPECT_TRUE(mentions(v, "unit 0: all_gather[0] on all-gather reads 'shard[0]'", "begin_step"))
      << joined(v);
}

TEST(StreamSchedule, DiagramNamesEveryStream) {
  const std::string text = to_text(build_stream_schedule(options(2, 1, true, true)));
  for (const char* stream : {"compute", "copy-in", "all-gather", "reduce-scatter", "all-reduce"}) {
    EXPECT_NE(text.find(stream), std::string::npos) << stream;
  }
  EXPECT_NE(text.find("wait gathered[1]@fwd"), std::string::npos) << text;
  // How docs/design.md's diagram is made: FSDP_PRINT_SCHEDULE=1 ./test_stream_schedule.
  if (std::getenv("FSDP_PRINT_SCHEDULE") != nullptr) std::cout << text;
}

}  // namespace
}  // namespace fsdp
