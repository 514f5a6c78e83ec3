// The watchdog of stream-ordered waits: see [Note: a deadline for stream-ordered waits] in
// stream_watchdog.h.
//
// Invariants:
// - watching_ belongs to the watchdog's thread alone; other threads only append to incoming_,
//   under mutex_. Works are polled with mutex_ released, so watch() never waits on a Work.
// - Each entry leaves watching_ exactly once: completed (silently) or expired (reported once).
// - With nothing to watch the thread sleeps until watch() or the destructor wakes it.
#include "stream_watchdog.h"

#include <exception>
#include <iterator>
#include <utility>

namespace fsdp::detail {

std::string timeout_message(const TimedOp& op) {
  std::string message = op.prefix + op.op;
  if (!op.unit.empty()) message += " of unit '" + op.unit + "'";
  return message + " timed out after " + std::to_string(op.timeout.count()) + " ms waiting for " +
         op.peer + op.how;
}

std::string timeout_peer(int rank, int size) {
  return size == 2 ? "rank " + std::to_string(1 - rank) : "another rank";
}

StreamWatchdog::StreamWatchdog(OnExpired on_expired, std::chrono::milliseconds poll)
    : on_expired_(std::move(on_expired)), poll_(poll), thread_([this] { run(); }) {}

StreamWatchdog::~StreamWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void StreamWatchdog::watch(WorkHandle work, TimedOp op, Clock::time_point deadline) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    incoming_.push_back(Entry{std::move(work), std::move(op), deadline});
  }
  wake_.notify_all();
}

std::size_t StreamWatchdog::watched() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return incoming_.size() + watching_count_;
}

void StreamWatchdog::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    if (watching_.empty()) {
      wake_.wait(lock, [this] { return stopping_ || !incoming_.empty(); });
    } else {
      wake_.wait_for(lock, poll_, [this] { return stopping_; });
    }
    if (stopping_) return;
    watching_.insert(watching_.end(), std::make_move_iterator(incoming_.begin()),
                     std::make_move_iterator(incoming_.end()));
    incoming_.clear();
    watching_count_ = watching_.size();
    lock.unlock();
    sweep();
    lock.lock();
    watching_count_ = watching_.size();
  }
}

void StreamWatchdog::sweep() {
  std::vector<Entry> pending;
  for (auto& entry : watching_) {
    bool completed = true;  // A Work whose poll throws has failed: its own wait() reports it.
    try {
      completed = entry.work->is_completed();
    } catch (const std::exception&) {
    }
    if (completed) continue;
    if (Clock::now() < entry.deadline) {
      pending.push_back(std::move(entry));
      continue;
    }
    try {
      on_expired_(timeout_message(entry.op));
    } catch (const std::exception&) {
      // The handler breaks the group, best effort; an exception must not end this thread (and
      // with it the process), nor stop the other ops' deadlines.
    }
  }
  watching_ = std::move(pending);
}

}  // namespace fsdp::detail
