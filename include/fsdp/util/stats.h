// Per-rank memory accounting of the FSDP runtime.
//
// The runtime reports every byte it allocates or frees for unsharded parameters, unsharded
// gradients and communication buffers here, so tests can assert memory bounds and the trainer
// can report them. "Live" counts are current; "peak" counts are maxima since the last
// reset_peaks(). Sharded state is not tracked here: it is fixed after fully_shard and is
// reported by FSDPModule::sharded_param_bytes() and friends.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <mutex>

namespace fsdp {

struct MemorySnapshot {
  int64_t unsharded_param_bytes = 0;  // full parameters materialised by all-gathers
  int64_t unsharded_grad_bytes = 0;   // full gradients awaiting reduce-scatter
  int64_t comm_buffer_bytes = 0;      // all-gather / reduce-scatter staging buffers
  int64_t unsharded_units = 0;        // units unsharded or with an all-gather in flight
  int64_t unsharded_bytes() const { return unsharded_param_bytes + unsharded_grad_bytes; }
};

class RankStats {
 public:
  void add_unsharded_params(int64_t bytes) {
    update([&](MemorySnapshot& m) { m.unsharded_param_bytes += bytes; });
  }
  void add_unsharded_grads(int64_t bytes) {
    update([&](MemorySnapshot& m) { m.unsharded_grad_bytes += bytes; });
  }
  void add_comm_buffers(int64_t bytes) {
    update([&](MemorySnapshot& m) { m.comm_buffer_bytes += bytes; });
  }
  void add_unsharded_units(int64_t n) {
    update([&](MemorySnapshot& m) { m.unsharded_units += n; });
  }

  // Seconds the compute path spent blocked on communication (waiting for an all-gather or a
  // reduce-scatter), since the last reset_exposed_comm().
  void add_exposed_comm(double seconds) {
    std::lock_guard<std::mutex> lock(mutex_);
    exposed_comm_s_ += seconds;
  }
  double exposed_comm_s() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return exposed_comm_s_;
  }
  void reset_exposed_comm() {
    std::lock_guard<std::mutex> lock(mutex_);
    exposed_comm_s_ = 0;
  }

  MemorySnapshot live() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return live_;
  }
  // Maxima of each field, and of unsharded_bytes() (params + grads alive at the same time).
  MemorySnapshot peak() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return peak_;
  }
  int64_t peak_unsharded_bytes() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return peak_unsharded_;
  }
  // Called after every change of a live count, on the thread that made it, outside the stats'
  // lock (--trace samples its memory track here). Set it before the runtime runs.
  void set_observer(std::function<void()> observer) { observer_ = std::move(observer); }

  // Peaks restart from the live values (call at the start of a step).
  void reset_peaks() {
    std::lock_guard<std::mutex> lock(mutex_);
    peak_ = live_;
    peak_unsharded_ = live_.unsharded_bytes();
  }

 private:
  template <typename Fn>
  void update(Fn&& fn) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      fn(live_);
      peak_.unsharded_param_bytes =
          std::max(peak_.unsharded_param_bytes, live_.unsharded_param_bytes);
      peak_.unsharded_grad_bytes = std::max(peak_.unsharded_grad_bytes, live_.unsharded_grad_bytes);
      peak_.comm_buffer_bytes = std::max(peak_.comm_buffer_bytes, live_.comm_buffer_bytes);
      peak_.unsharded_units = std::max(peak_.unsharded_units, live_.unsharded_units);
      peak_unsharded_ = std::max(peak_unsharded_, live_.unsharded_bytes());
    }
    if (observer_) observer_();  // outside the lock: the observer reads live()
  }

  mutable std::mutex mutex_;
  MemorySnapshot live_;
  MemorySnapshot peak_;
  int64_t peak_unsharded_ = 0;
  double exposed_comm_s_ = 0;
  std::function<void()> observer_;
};

}  // namespace fsdp
