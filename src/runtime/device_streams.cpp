// DeviceStreams and its Op; see device_streams.h.
//
// Invariants: in program order no c10::Stream, c10::Event or guard is ever created, and a
// released buffer is dropped before release_after returns, so the CPU runtime does exactly the
// work it did before streams existed. With streams, a deferred buffer is dropped only after its
// stream waited on the event recorded after its last reader.
#include "runtime/device_streams.h"

#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <exception>
#include <utility>

namespace fsdp::detail {

std::string schedule_name(const char* base, const std::string& unit, const char* phase) {
  std::string out = std::string(base) + "[" + unit + "]";
  return phase == nullptr ? out : out + "@" + phase;
}

DeviceStreams::DeviceStreams(c10::Device device, RuntimeObserver& observer)
    : device_(device), observer_(&observer) {
  if (device.is_cpu()) return;
  const c10::impl::VirtualGuardImpl impl(device.type());
  const c10::Stream current = impl.getStream(device);
  pool_.emplace(std::array<c10::Stream, kScheduleStreams>{
      current, impl.getStreamFromGlobalPool(device), impl.getStreamFromGlobalPool(device),
      impl.getStreamFromGlobalPool(device), impl.getStreamFromGlobalPool(device)});
}

c10::Stream DeviceStreams::stream(ScheduleStream role) const {
  TORCH_INTERNAL_ASSERT(pool_.has_value(), "fsdp: ", device_, " has no streams");
  if (role == ScheduleStream::kCompute) {
    return compute_.has_value() ? *compute_
                                : c10::impl::VirtualGuardImpl(device_.type()).getStream(device_);
  }
  return (*pool_)[static_cast<size_t>(role)];
}

void DeviceStreams::release_after(ScheduleStream role, at::Tensor buffer, const StreamEvent& after,
                                  const char* base, const std::string& unit, const char* phase) {
  if (in_program_order()) {
    buffer = at::Tensor();  // nothing is in flight: free now, as the CPU runtime always did
    if (!recording()) return;
  }
  deferred_.push_back({role, std::move(buffer), after,
                       recording() ? schedule_name(base, unit, phase) : std::string()});
}

void DeviceStreams::flush(ScheduleStream role) {
  auto due = [role](const Deferred& d) { return d.role == role; };
  if (std::none_of(deferred_.begin(), deferred_.end(), due)) return;
  {
    static const std::string kNoUnit;
    Op release(*this, role, ScheduleOpKind::kRelease, kNoUnit);
    for (const Deferred& d : deferred_) {
      if (!due(d)) continue;
      release.wait(d.after);
      if (recording()) release.log_->frees.push_back(d.name);
    }
    // The buffers drop here, after the waits were issued on role's stream.
    deferred_.erase(std::remove_if(deferred_.begin(), deferred_.end(), due), deferred_.end());
  }
}

void DeviceStreams::flush_all() {
  for (int role = 0; role < kScheduleStreams; ++role) flush(static_cast<ScheduleStream>(role));
}

void DeviceStreams::synchronize() {
  if (in_program_order()) return;
  for (int role = 0; role < kScheduleStreams; ++role) {
    c10::Event done(device_.type());
    done.record(stream(static_cast<ScheduleStream>(role)));
    done.synchronize();
  }
}

DeviceStreams::Op::Op(DeviceStreams& streams, ScheduleStream role, ScheduleOpKind kind,
                      const std::string& unit, bool report)
    : streams_(streams), role_(role), unit_(unit), uncaught_(std::uncaught_exceptions()) {
  if (!streams_.in_program_order()) {
    if (!streams_.compute_.has_value()) {
      // Compute is the thread's current stream when the outermost op begins.
      streams_.compute_ = streams_.stream(ScheduleStream::kCompute);
      outermost_ = true;
    }
    if (role != ScheduleStream::kCompute) guard_.reset_stream(streams_.stream(role));
  }
  if (report && streams_.recording()) {
    log_.emplace();
    log_->stream = role;
    log_->kind = kind;
  }
}

DeviceStreams::Op::~Op() {
  if (outermost_) streams_.compute_.reset();
  if (!log_ || std::uncaught_exceptions() > uncaught_) return;
  streams_.observer_->stream_op(std::move(*log_), unit_);
}

std::string DeviceStreams::Op::named(const char* base, const char* phase) const {
  return schedule_name(base, unit_, phase);
}

DeviceStreams::Op& DeviceStreams::Op::wait(const StreamEvent& event) {
  if (event.event) event.event->block(streams_.stream(role_));
  if (log_) log_->waits.push_back(event.name);
  return *this;
}

DeviceStreams::Op& DeviceStreams::Op::wait_for_step_begin() {
  if (streams_.step_synced_) return *this;
  streams_.step_synced_ = true;
  static const std::string kNoUnit;
  StreamEvent begun;
  {
    Op mark(streams_, ScheduleStream::kCompute, ScheduleOpKind::kBeginStep, kNoUnit);
    if (mark.log_) mark.log_->record = "step_begin";
    if (!streams_.in_program_order()) {
      begun.event = std::make_shared<c10::Event>(streams_.device_.type());
      begun.event->record(streams_.stream(ScheduleStream::kCompute));
    }
    if (streams_.recording()) begun.name = "step_begin";
  }
  return wait(begun);
}

DeviceStreams::Op& DeviceStreams::Op::reads(const char* base, const char* phase) {
  if (log_) log_->reads.push_back(named(base, phase));
  return *this;
}

DeviceStreams::Op& DeviceStreams::Op::writes(const char* base, const char* phase) {
  if (log_) log_->writes.push_back(named(base, phase));
  return *this;
}

DeviceStreams::Op& DeviceStreams::Op::frees(const char* base, const char* phase) {
  if (log_) log_->frees.push_back(named(base, phase));
  return *this;
}

StreamEvent DeviceStreams::Op::record(const char* base, const char* phase) {
  StreamEvent out;
  if (!streams_.in_program_order()) {
    out.event = std::make_shared<c10::Event>(streams_.device_.type());
    out.event->record(streams_.stream(role_));
  }
  if (log_) {
    out.name = named(base, phase);
    log_->record = out.name;
  }
  return out;
}

}  // namespace fsdp::detail
