// Private to src/comm: our deadline for collectives that no host thread waits for.
//
// [Note: a deadline for stream-ordered waits]
// Work::wait_on_stream() orders a device stream after a collective and returns at once, so the
// host runs ahead to the next unit and nobody is left to notice an op that never ends (a rank
// that died or never issued it). Until now only c10d's watchdog did, at the timeout plus its
// slack and with its own message that names no unit. A StreamWatchdog is that missing waiter: a
// thread of its own that polls each watched Work's is_completed() until it completes, or until
// its deadline (the same one Work::wait() applies: the group's timeout from the issue) passes.
// Then it hands the backend one message naming the rank, the op, the unit and the timeout; the
// backend breaks the group with it (so the next call on the group throws it) and aborts the
// communicator (so the kernel waiting for a peer ends and the streams behind it move on).
//
// A watched Work stays referenced until it completes or expires: c10d keeps the tensors of an
// op alive until then anyway. is_completed() is called on the watchdog's thread, never under
// the watchdog's lock, so a Work may lock its own mutex there.
#pragma once

#include <fsdp/comm/process_group.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace fsdp::detail {

// What a timeout message names. The message reads
//   "<prefix><op> of unit '<unit>' timed out after <timeout> ms waiting for <peer><how>"
// (" of unit ..." only with a unit: the CollectiveLabel current at the issue).
struct TimedOp {
  std::string prefix;  // "fsdp: rank R of W: "
  std::string op;      // "all_gather_into_tensor"
  std::string unit;    // "h.3"; "" when the op had no label
  std::string peer;    // "rank 1", or "another rank" when W > 2
  std::chrono::milliseconds timeout{0};
  std::string how;  // appended as is: " (the NCCL communicator was aborted)"
};

// The message above.
std::string timeout_message(const TimedOp& op);

// "rank <1 - rank>" for two ranks (the only peer there is), else "another rank".
std::string timeout_peer(int rank, int size);

class StreamWatchdog {
 public:
  using Clock = std::chrono::steady_clock;
  // Called on the watchdog's thread, once for each watched op whose deadline passed before it
  // completed, with timeout_message(op).
  using OnExpired = std::function<void(const std::string& message)>;

  // Starts the thread. poll is how often each watched op's is_completed() is asked (optional,
  // defaults to kDefaultPoll).
  explicit StreamWatchdog(OnExpired on_expired, std::chrono::milliseconds poll = kDefaultPoll);
  // Stops and joins the thread. Ops still watched are dropped unreported: their group is going
  // away, and its owner reports on them (or shuts the communicator down).
  ~StreamWatchdog();
  StreamWatchdog(const StreamWatchdog&) = delete;
  StreamWatchdog& operator=(const StreamWatchdog&) = delete;

  // Watches work until it completes or deadline passes. Does not block.
  void watch(WorkHandle work, TimedOp op, Clock::time_point deadline);

  // How many ops are watched (taken on, or waiting to be), for tests.
  std::size_t watched() const;

  // c10d's watchdog sleeps 100 ms between looks; a deadline is seconds long, so the same
  // granularity costs nothing in accuracy and little in host time.
  static constexpr std::chrono::milliseconds kDefaultPoll{100};

 private:
  struct Entry {
    WorkHandle work;
    TimedOp op;
    Clock::time_point deadline;
  };

  void run();
  // Drops the completed entries of watching_ and reports the expired ones.
  void sweep();

  const OnExpired on_expired_;
  const std::chrono::milliseconds poll_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::vector<Entry> incoming_;     // Under mutex_: handed over by watch().
  std::vector<Entry> watching_;     // The thread's own.
  std::size_t watching_count_ = 0;  // Under mutex_: watching_.size(), for watched().
  std::thread thread_;              // Last: starts once the members above exist.
};

}  // namespace fsdp::detail
