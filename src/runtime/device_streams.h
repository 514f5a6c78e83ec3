// DeviceStreams: the streams and events one fully_shard'ed tree orders its work with (FSDP2's
// FSDPCommContext), in c10's device-generic terms (c10::Stream, c10::Event), so the runtime
// compiles without any device's headers and runs on any device with a registered guard.
//
// The roles are stream_schedule.h's: compute (the calling thread's current stream), all-gather
// copy-in, all-gather, reduce-scatter and all-reduce, each a stream from the device's pool. Work
// hands over between streams only through events; a buffer read on another stream is released
// on the stream that allocated it after that stream waited on its last reader's event (never
// record_stream: the caching allocator then reuses the block in stream order, with no deferred
// frees to fragment it, torchtitan #735).
//
// On a device without streams (CPU) every stream is the calling thread, work runs in program
// order, no event exists and a release frees at once: the runtime's CPU work and its order are
// what they were before streams existed. Either way, each op is reported to the root unit's
// observer when it records the schedule (RuntimeObserver::stream_op); else an op costs a branch.
#pragma once

#include <fsdp/runtime/observer.h>
#include <fsdp/runtime/stream_schedule.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>
#include <c10/core/StreamGuard.h>

#include <array>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::detail {

// A recorded event, shared by the ops that wait on it. Empty (no c10::Event) on a device without
// streams; named only while the schedule is recorded.
struct StreamEvent {
  std::shared_ptr<c10::Event> event;
  std::string name;
};

// "base[unit]" or "base[unit]@phase": a buffer's or event's name in the recorded schedule.
std::string schedule_name(const char* base, const std::string& unit, const char* phase = nullptr);

class DeviceStreams {
 public:
  DeviceStreams(c10::Device device, RuntimeObserver& observer);

  c10::Device device() const { return device_; }
  // True on a device without streams: waits, records and guards do nothing.
  bool in_program_order() const { return !pool_.has_value(); }

  // The root unit's observer: it receives the stream ops while it records the schedule.
  void bind_observer(RuntimeObserver& observer) { observer_ = &observer; }
  bool recording() const { return observer_->records_schedule(); }

  // The stream a role runs on: compute is the calling thread's current stream.
  c10::Stream stream(ScheduleStream role) const;

  // A new step begins: the next copy-in first waits on compute (the optimizer wrote the shards).
  void begin_step() { step_synced_ = false; }

  // Releases every deferred buffer of role whose event has been recorded (all of them: an event
  // is recorded before its buffer is deferred), in one kRelease op.
  void flush(ScheduleStream role);
  void flush_all();
  // Blocks the host until every stream has finished the work issued so far (offload: the
  // optimizer then reads gradients whose copies to host are done). Nothing in program order.
  void synchronize();
  // Frees buffer on role, the stream that allocated it, once role has waited on after: at the
  // next flush(role). Frees it at once in program order.
  void release_after(ScheduleStream role, at::Tensor buffer, const StreamEvent& after,
                     const char* base, const std::string& unit, const char* phase = nullptr);

  class Op;

 private:
  struct Deferred {
    ScheduleStream role;
    at::Tensor buffer;  // undefined in program order: already freed
    StreamEvent after;
    std::string name;
  };

  c10::Device device_;
  // The four side streams; nullopt on a device without streams.
  std::optional<std::array<c10::Stream, kScheduleStreams>> pool_;
  RuntimeObserver* observer_;
  std::vector<Deferred> deferred_;
  // The compute stream while an Op guards another stream current; nullopt outside any Op.
  std::optional<c10::Stream> compute_;
  bool step_synced_ = false;
};

// One op on one stream, as stream_schedule.h describes it: the stream waits on events, the work
// (the caller's code while the Op lives) runs with that stream current, then an event may be
// recorded. Reads, writes and frees are only named for the recorded schedule. The op is reported
// when the Op ends, unless an exception is unwinding (then the step is abandoned anyway).
class DeviceStreams::Op {
 public:
  // report = false: the op does its stream work but is not reported (a unit with nothing
  // gathered, whose reshard frees no gathered buffer).
  Op(DeviceStreams& streams, ScheduleStream role, ScheduleOpKind kind, const std::string& unit,
     bool report = true);
  ~Op();
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;

  // The op's stream waits on event (an empty event, from program order, is skipped).
  Op& wait(const StreamEvent& event);
  // The step's first copy-in: records an event on compute and waits on it.
  Op& wait_for_step_begin();
  // Names, for the recorded schedule only.
  Op& reads(const char* base, const char* phase = nullptr);
  Op& writes(const char* base, const char* phase = nullptr);
  Op& frees(const char* base, const char* phase = nullptr);
  // Records an event on the op's stream after the work issued so far.
  StreamEvent record(const char* base, const char* phase = nullptr);

 private:
  friend class DeviceStreams;
  std::string named(const char* base, const char* phase) const;

  DeviceStreams& streams_;
  c10::OptionalStreamGuard guard_;
  ScheduleStream role_;
  const std::string& unit_;
  std::optional<ScheduleOp> log_;  // only while recording
  int uncaught_ = 0;
  bool outermost_ = false;  // captured the compute stream for the ops nested in it
};

}  // namespace fsdp::detail
