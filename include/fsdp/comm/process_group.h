// The communication interface the FSDP runtime is written against.
//
// A ProcessGroup is one rank's handle on a group of W ranks. Every collective is asynchronous:
// it is queued on the group's progress thread in call order and returns a Work handle at once.
// Because every rank issues the same collectives in the same order, the queue order is the
// matching order; callers never need tags. The caller must keep input and output tensors
// alive and untouched until wait() returns (the Work also holds references to them).
//
// No vendor type (gloo, nccl.h, mpi.h) appears here; backends live in src/comm/<backend>/.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace fsdp {

enum class ReduceOp { kSum, kAvg };

// Names the collectives this thread issues while it is alive, for the flight recorder and the
// messages that name where ranks diverged (FSDP units label theirs with the unit's path, as
// "h.3"). Scopes nest; the previous label comes back when one ends. Keeps its own copy of the
// label, so a temporary string is fine.
class CollectiveLabel {
 public:
  explicit CollectiveLabel(std::string label);
  ~CollectiveLabel();
  CollectiveLabel(const CollectiveLabel&) = delete;
  CollectiveLabel& operator=(const CollectiveLabel&) = delete;

  // The innermost live label of this thread, "" when none.
  static const std::string& current();

 private:
  std::string label_;
  const std::string* previous_;
};

// Handle on one queued collective. wait() blocks until it finished and rethrows its error
// (for instance a timeout, whose message names the rank, the operation and the peer).
class Work {
 public:
  using Clock = std::chrono::steady_clock;

  virtual ~Work() = default;
  virtual void wait() = 0;
  virtual bool is_completed() = 0;
  // Orders the calling thread's current stream after the op, without blocking the host where
  // the backend can (nccl: c10d's stream wait); later work on that stream sees the result. The
  // runtime calls this on a device, where the host must stay free to issue the next unit.
  // Backends whose ops run on the host (gloo, mpi) have no stream to order: they wait. The nccl
  // backend holds a stream-ordered op to wait()'s deadline on a thread of its own: past it, the
  // group breaks with the timeout message (rank, op, unit), which the next call on the group
  // throws.
  virtual void wait_on_stream() { wait(); }

  // When the backend began and finished running the op (for timelines). Valid once
  // is_completed(); before that they read as the epoch.
  Clock::time_point started_at() const { return started_at_.load(); }
  Clock::time_point finished_at() const { return finished_at_.load(); }

 protected:
  void mark_started() { started_at_.store(Clock::now()); }
  void mark_finished() { finished_at_.store(Clock::now()); }
  // For a Work that wraps another: takes over the wrapped op's times.
  void copy_times_from(const Work& other) {
    started_at_.store(other.started_at());
    finished_at_.store(other.finished_at());
  }

 private:
  std::atomic<Clock::time_point> started_at_{};
  std::atomic<Clock::time_point> finished_at_{};
};
using WorkHandle = std::shared_ptr<Work>;

// Bytes and calls per kind of collective, as seen by one rank. "payload" is the size of the
// collective's logical buffer (all-gather: its output; reduce-scatter: its input; all-reduce,
// broadcast and reduce: the tensor). "sent" is what this rank actually put on the wire, where the
// backend can know it exactly.
struct CollectiveCounters {
  int64_t calls = 0;
  int64_t payload_bytes = 0;
  int64_t sent_bytes = 0;
};
struct CommCounters {
  CollectiveCounters all_gather;
  CollectiveCounters reduce_scatter;
  CollectiveCounters all_reduce;
  CollectiveCounters broadcast;
  CollectiveCounters reduce;
  // Seconds callers spent blocked on this group's collectives, where they report it (the tensor-
  // parallel layers do, see add_waited).
  double waited_s = 0;
  // Seconds this group spent running collectives, each from its start to its end on the group's
  // progress thread (gloo and mpi; 0 on nccl, whose collectives run on streams). Groups of one
  // rank run nothing and add nothing.
  double busy_s = 0;
};

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The device whose tensors this group moves (CPU for gloo).
  virtual c10::Device device() const = 0;
  virtual std::string backend_name() const = 0;

  // output (contiguous, size() * input.numel() elements, input's dtype) receives every rank's
  // input in rank order.
  virtual WorkHandle all_gather_into_tensor(const at::Tensor& output, const at::Tensor& input) = 0;
  // input (contiguous, size() * output.numel() elements) is reduced element-wise over ranks;
  // this rank receives chunk rank() of the result in output. A real reduce-scatter: each rank
  // sends (W-1)/W of input, never the whole buffer.
  virtual WorkHandle reduce_scatter_tensor(const at::Tensor& output, const at::Tensor& input,
                                           ReduceOp op) = 0;
  virtual WorkHandle all_reduce(const at::Tensor& tensor, ReduceOp op) = 0;
  virtual WorkHandle broadcast(const at::Tensor& tensor, int root) = 0;
  // tensor (floating point) is reduced element-wise over ranks into root's tensor; the other
  // ranks' tensors are left as they were (for inter-tensor ZeRO-3, which reduces each gradient
  // to its owner).
  virtual WorkHandle reduce(const at::Tensor& tensor, int root, ReduceOp op) = 0;
  virtual WorkHandle barrier() = 0;

  // A new group of the given ranks of this group, numbered in that order (for the dimensions
  // of a 2-D mesh). Only those ranks take part: each calls it with the same ranks and name and
  // gets its handle (blocking until all of them joined); any other rank gets nullptr at once.
  // name must be unique among the splits of this group. Throws on duplicate or out-of-range
  // ranks.
  virtual std::shared_ptr<ProcessGroup> split(const std::vector<int>& ranks,
                                              const std::string& name) = 0;

  // A snapshot of this rank's counters since construction or the last reset. Virtual so that a
  // group wrapping another (the flight recorder) reports the wrapped backend's counts.
  virtual CommCounters counters() const {
    std::lock_guard<std::mutex> lock(counters_mutex_);
    return counters_;
  }
  // A caller that blocks on this group's collective inside its compute (a tensor-parallel layer)
  // reports the time here, for fsdp-train's tp_comm_s. Virtual like counters().
  virtual void add_waited(double seconds) {
    update_counters([&](CommCounters& c) { c.waited_s += seconds; });
  }
  virtual void reset_counters() {
    std::lock_guard<std::mutex> lock(counters_mutex_);
    counters_ = CommCounters{};
  }

 protected:
  // Backends call this when they queue (payload) or send (sent) bytes.
  template <typename Fn>
  void update_counters(Fn&& fn) {
    std::lock_guard<std::mutex> lock(counters_mutex_);
    fn(counters_);
  }

 private:
  mutable std::mutex counters_mutex_;
  CommCounters counters_;
};

}  // namespace fsdp
