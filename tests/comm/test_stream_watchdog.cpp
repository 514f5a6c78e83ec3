// The watchdog of stream-ordered waits (src/comm/stream_watchdog.h), on the CPU with fake Works
// whose completion the test decides: an op past its deadline is reported once, with a message
// naming the rank, the op, the unit and the timeout; an op that completes in time, or fails, is
// dropped unreported; each op keeps its own deadline; the watchdog's thread survives a throwing
// handler, polls Works without holding its lock, and lets go of everything when destroyed,
// without waiting out a deadline. The nccl backend's use of it runs on a GPU (tests/cuda/).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "comm/stream_watchdog.h"

namespace fsdp::detail {
namespace {

using ::testing::ElementsAre;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kPoll{5};
constexpr const char* kHow = " (the test's watchdog)";

// A Work whose completion the test sets; is_completed() optionally runs a probe first.
class FakeWork final : public Work {
 public:
  void wait() override { throw std::logic_error("the watchdog must not wait() on a Work"); }
  bool is_completed() override {
    if (probe) probe();
    if (fails) throw std::runtime_error("the op failed");
    return completed.load();
  }
  std::atomic<bool> completed{false};
  std::atomic<bool> fails{false};
  std::function<void()> probe;
};

// The messages a watchdog reported, in order.
class Reports {
 public:
  StreamWatchdog::OnExpired handler() {
    return [this](const std::string& message) {
      std::lock_guard<std::mutex> lock(mutex_);
      messages_.push_back(message);
    };
  }
  std::vector<std::string> messages() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return messages_;
  }
  // Waits up to limit for n reports; returns how many there are.
  std::size_t wait_for(std::size_t n, milliseconds limit = milliseconds(5000)) const {
    const auto until = Clock::now() + limit;
    while (messages().size() < n && Clock::now() < until) std::this_thread::sleep_for(kPoll);
    return messages().size();
  }

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> messages_;
};

TimedOp op_of_unit(const std::string& unit, int rank = 0, int size = 2,
                   milliseconds timeout = milliseconds(300)) {
  return TimedOp{"fsdp: rank " + std::to_string(rank) + " of " + std::to_string(size) + ": ",
                 "all_gather_into_tensor",
                 unit,
                 timeout_peer(rank, size),
                 timeout,
                 kHow};
}

// Waits until the watchdog let go of every op, up to 5 s.
void wait_until_idle(const StreamWatchdog& watchdog) {
  const auto until = Clock::now() + milliseconds(5000);
  while (watchdog.watched() > 0 && Clock::now() < until) std::this_thread::sleep_for(kPoll);
}

TEST(StreamWatchdog, OpPastItsDeadlineIsReportedOnceNamingRankOpUnitAndTimeout) {
  Reports reports;
  StreamWatchdog watchdog(reports.handler(), kPoll);
  auto work = std::make_shared<FakeWork>();
  const auto start = Clock::now();
  watchdog.watch(work, op_of_unit("h.3"), start + milliseconds(300));
  ASSERT_EQ(reports.wait_for(1), 1u);
  const auto elapsed = Clock::now() - start;
  EXPECT_GE(elapsed, milliseconds(300));
  EXPECT_LT(elapsed, milliseconds(2000));
  std::this_thread::sleep_for(milliseconds(100));  // time for a wrong second report
  EXPECT_THAT(reports.messages(),
              ElementsAre("fsdp: rank 0 of 2: all_gather_into_tensor of unit 'h.3' timed out "
                          "after 300 ms waiting for rank 1 (the test's watchdog)"));
  EXPECT_EQ(watchdog.watched(), 0u);
}

// Each op's how ends its message: the NCCL backend watches a collective's issue and its
// stream-ordered wait with different ones ([Note: a deadline for the issue]).
TEST(StreamWatchdog, OpWithItsOwnHowEndsTheMessageWithIt) {
  Reports reports;
  StreamWatchdog watchdog(reports.handler(), kPoll);
  TimedOp op = op_of_unit("h.2");
  op.how = " (blocked in the issue)";
  watchdog.watch(std::make_shared<FakeWork>(), op, Clock::now() + milliseconds(100));
  ASSERT_EQ(reports.wait_for(1), 1u);
  EXPECT_THAT(reports.messages(),
              ElementsAre("fsdp: rank 0 of 2: all_gather_into_tensor of unit 'h.2' timed out "
                          "after 300 ms waiting for rank 1 (blocked in the issue)"));
}

TEST(StreamWatchdog, MessageLeavesOutAMissingUnitAndNamesNoPeerAmongMany) {
  TimedOp op = op_of_unit("", 2, 4, milliseconds(1500));
  op.how = " (x)";
  EXPECT_EQ(timeout_message(op),
            "fsdp: rank 2 of 4: all_gather_into_tensor timed out after 1500 ms waiting for "
            "another rank (x)");
  EXPECT_EQ(timeout_peer(1, 2), "rank 0");
}

TEST(StreamWatchdog, OpThatCompletesInTimeIsDroppedUnreported) {
  Reports reports;
  StreamWatchdog watchdog(reports.handler(), kPoll);
  auto work = std::make_shared<FakeWork>();
  std::weak_ptr<FakeWork> watched = work;
  watchdog.watch(work, op_of_unit("h.0"), Clock::now() + milliseconds(300));
  work.reset();  // the caller may drop its handle: the watchdog keeps the op
  std::this_thread::sleep_for(milliseconds(50));
  ASSERT_EQ(watchdog.watched(), 1u);
  if (auto alive = watched.lock()) {
    alive->completed = true;
  } else {
    FAIL() << "the watchdog let go of an op before it completed";
  }
  wait_until_idle(watchdog);
  std::this_thread::sleep_for(milliseconds(400));  // past the deadline
  EXPECT_TRUE(reports.messages().empty());
  EXPECT_TRUE(watched.expired()) << "the watchdog still holds a completed op";
}

TEST(StreamWatchdog, FailedOpIsLeftToItsOwnWait) {
  Reports reports;
  StreamWatchdog watchdog(reports.handler(), kPoll);
  auto work = std::make_shared<FakeWork>();
  work->fails = true;
  watchdog.watch(work, op_of_unit("h.1"), Clock::now() + milliseconds(100));
  wait_until_idle(watchdog);
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_TRUE(reports.messages().empty());
}

TEST(StreamWatchdog, EachOpKeepsItsOwnDeadline) {
  Reports reports;
  StreamWatchdog watchdog(reports.handler(), kPoll);
  auto early = std::make_shared<FakeWork>();
  auto late = std::make_shared<FakeWork>();
  const auto start = Clock::now();
  watchdog.watch(late, op_of_unit("h.1"), start + milliseconds(600));
  watchdog.watch(early, op_of_unit("h.0"), start + milliseconds(150));
  ASSERT_EQ(reports.wait_for(1), 1u);
  EXPECT_LT(Clock::now() - start, milliseconds(600));
  late->completed = true;
  wait_until_idle(watchdog);
  std::this_thread::sleep_for(milliseconds(600));
  ASSERT_EQ(reports.messages().size(), 1u);
  EXPECT_THAT(reports.messages()[0], ::testing::HasSubstr("of unit 'h.0' timed out"));
}

TEST(StreamWatchdog, ThrowingHandlerStopsNeitherTheThreadNorTheOtherDeadlines) {
  Reports reports;
  std::atomic<int> calls{0};
  auto record = reports.handler();
  StreamWatchdog watchdog(
      [&](const std::string& message) {
        if (calls++ == 0) throw std::runtime_error("abort failed");
        record(message);
      },
      kPoll);
  const auto start = Clock::now();
  watchdog.watch(std::make_shared<FakeWork>(), op_of_unit("h.0"), start + milliseconds(50));
  watchdog.watch(std::make_shared<FakeWork>(), op_of_unit("h.1"), start + milliseconds(300));
  ASSERT_EQ(reports.wait_for(1), 1u);
  EXPECT_EQ(calls.load(), 2);
  EXPECT_THAT(reports.messages()[0], ::testing::HasSubstr("of unit 'h.1' timed out"));
}

// A Work may lock its own mutex in is_completed(), while its owner holds that mutex to call
// watch(): the watchdog must poll with its own lock released. The probe asks the watchdog for
// its count from another thread; under the lock that would not answer. (That thread is
// detached, and holds the watchdog, so that a failure here is reported, not a deadlock.)
TEST(StreamWatchdog, PollsWorksWithItsLockReleased) {
  Reports reports;
  auto watchdog = std::make_shared<StreamWatchdog>(reports.handler(), kPoll);
  auto work = std::make_shared<FakeWork>();
  std::atomic<int> blocked{0};
  std::weak_ptr<StreamWatchdog> weak = watchdog;
  work->probe = [&blocked, weak] {
    auto answered = std::make_shared<std::promise<void>>();
    std::future<void> answer = answered->get_future();
    std::thread([answered, held = weak.lock()] {
      if (held) held->watched();
      answered->set_value();
    }).detach();
    if (answer.wait_for(milliseconds(1000)) != std::future_status::ready) ++blocked;
  };
  watchdog->watch(work, op_of_unit("h.0"), Clock::now() + milliseconds(60000));
  std::this_thread::sleep_for(milliseconds(100));
  work->completed = true;
  wait_until_idle(*watchdog);
  EXPECT_EQ(blocked.load(), 0) << "is_completed() was called under the watchdog's lock";
}

TEST(StreamWatchdog, DestructionLetsGoAtOnceWithoutReporting) {
  Reports reports;
  auto work = std::make_shared<FakeWork>();
  std::weak_ptr<FakeWork> watched = work;
  const auto start = Clock::now();
  {
    StreamWatchdog watchdog(reports.handler(), kPoll);
    watchdog.watch(std::move(work), op_of_unit("h.0"), start + milliseconds(60000));
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_LT(Clock::now() - start, milliseconds(2000));
  EXPECT_TRUE(reports.messages().empty());
  EXPECT_TRUE(watched.expired());
}

}  // namespace
}  // namespace fsdp::detail
