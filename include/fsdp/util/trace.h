// Per-rank timeline of the FSDP runtime, written as Chrome trace-event JSON (opens in Perfetto
// and chrome://tracing).
//
// Events are complete events ("ph":"X"): compute (each unit's forward and backward, the
// optimizer step), comm (each all-gather and reduce-scatter from issue to completion, with the
// unit and the bytes) and copy (copy-out after an all-gather, copy-in before a reduce-scatter).
// Timestamps come from the steady clock, which all processes of a machine share, so the ranks'
// files line up. Recording is off until enable(); a disabled tracer costs one branch per event.
//
// Counter tracks ("ph":"C", which Perfetto draws as graphs): with a sampler set, every event
// also records the sampler's values at its end, and so does every sample_counters() call (the
// trainer samples live tensor bytes by category whenever the runtime's memory changes).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace fsdp {

class Tracer {
 public:
  using Clock = std::chrono::steady_clock;

  void enable(bool on = true) { enabled_ = on; }
  bool enabled() const { return enabled_; }

  // Records one complete event. track names the row it is drawn on ("compute" or "comm").
  // Thread-safe.
  void complete(const char* category, std::string name, Clock::time_point begin,
                Clock::time_point end, std::string unit = {}, int64_t bytes = -1,
                const char* track = "compute");

  // Named values sampled for the counter track `name` after every event (nullptr: none). The
  // sampler may be called from any thread that records an event; it must be thread-safe. Set it
  // before enable(), not while events are being recorded.
  using Sample = std::vector<std::pair<std::string, int64_t>>;
  void set_counter_sampler(std::string name, std::function<Sample()> sampler);

  // Records the sampler's values now (when enabled and a sampler is set); complete() does this
  // after every event, and a caller may at any other moment, such as when memory changes.
  void sample_counters();

  size_t size() const;
  // Writes every event recorded so far as {"traceEvents": [...]} with pid = rank. Throws if the
  // file cannot be written.
  void write_chrome_trace(const std::string& path, int rank) const;

 private:
  struct Event {
    const char* category;
    std::string name;
    Clock::time_point begin, end;
    std::string unit;
    int64_t bytes;
    const char* track;
  };
  struct CounterSample {
    Clock::time_point at;
    Sample values;
  };
  bool enabled_ = false;
  mutable std::mutex mutex_;
  std::vector<Event> events_;
  std::string counter_name_;
  std::function<Sample()> sampler_;
  std::vector<CounterSample> samples_;
};

// Records [construction, destruction) as one complete event when the tracer is enabled.
//
// [Note: a scope reports only what it timed]
// A scope reads the clock at construction only if the tracer (or observer) records then. One
// that began while it was off and ends after it was turned on has no begin: reporting it would
// draw an event from the clock's epoch, which a timeline shows as decades long. Such a scope
// reports nothing; one that began while on and ends after it was turned off reports nothing
// either (the tracer was told to stop).
class TraceScope {
 public:
  TraceScope(Tracer& tracer, const char* category, std::string name, std::string unit = {})
      : tracer_(tracer),
        category_(category),
        name_(std::move(name)),
        unit_(std::move(unit)),
        recording_(tracer.enabled()),
        begin_(recording_ ? Tracer::Clock::now() : Tracer::Clock::time_point{}) {}
  // Only a scope that began while the tracer was on reports: one opened before it was enabled
  // has no begin time (see [Note: a scope reports only what it timed]).
  ~TraceScope() {
    if (recording_ && tracer_.enabled()) {
      tracer_.complete(category_, std::move(name_), begin_, Tracer::Clock::now(), std::move(unit_));
    }
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  Tracer& tracer_;
  const char* category_;
  std::string name_;
  std::string unit_;
  bool recording_;
  Tracer::Clock::time_point begin_;
};

}  // namespace fsdp
