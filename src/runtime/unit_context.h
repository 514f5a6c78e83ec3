// UnitContext: what the parts of one FSDP unit share. A unit is its state machine (ParamGroup),
// the placement that unshards its parameters (Unsharder) and the reducer of its gradients
// (GradientReducer); each names the unit the same way in errors, counts its bytes and times on
// the same mesh, orders its work on the streams of the tree the unit belongs to, and waits on a
// collective the same way. The context holds references to the unit's own label, mesh and
// observer (the unit outlives its parts, and is never moved), and the tree's streams, re-bound
// when the unit joins a tree. Every count, wait and span goes to the observer
// ([Note: the runtime reports to an observer]).
#pragma once

#include "runtime/device_streams.h"

#include <fsdp/comm/process_group.h>
#include <fsdp/device_mesh.h>
#include <fsdp/runtime/observer.h>

#include <ATen/core/Tensor.h>

#include <exception>
#include <memory>
#include <string>

namespace fsdp::detail {

class UnitContext {
 public:
  UnitContext(const std::string& label, const DeviceMesh& mesh, DeviceStreams& streams,
              RuntimeObserver& observer)
      : label_(label), mesh_(mesh), streams_(&streams), observer_(&observer) {}
  UnitContext(const UnitContext&) = delete;
  UnitContext& operator=(const UnitContext&) = delete;

  // For error messages: the unit's path under the root, or its module's type name.
  const std::string& label() const { return label_; }
  const DeviceMesh& mesh() const { return mesh_; }
  RuntimeObserver& observer() const { return *observer_; }
  void bind_observer(RuntimeObserver& observer) { observer_ = &observer; }
  // A change of a live count (RuntimeObserver::held).
  void held(HeldKind kind, int64_t delta) const { observer_->held(kind, delta); }
  // A span of this unit, reported only while the observer records spans.
  // (Name: a string or a literal, made a string only when the span is recorded.)
  template <class Name>
  void span(const char* category, const Name& name, RuntimeObserver::Clock::time_point begin,
            RuntimeObserver::Clock::time_point end, int64_t bytes = -1,
            const char* track = "compute") const {
    if (observer_->records_spans()) {
      observer_->span(category, std::string(name), begin, end, label_, bytes, track);
    }
  }
  // The streams and events of the tree the unit belongs to (its own until it joins one).
  DeviceStreams& streams() const { return *streams_; }
  void bind_streams(DeviceStreams& streams) { streams_ = &streams; }
  at::TensorOptions device_options(at::ScalarType dtype) const {
    return at::TensorOptions().dtype(dtype).device(mesh_.device());
  }

  // Blocks on work, counting the wait as exposed communication; rethrows with context.
  void wait_for(const WorkHandle& work, const char* what) const;
  // After issuing a collective under a stream guard: with streams, the guarded stream waits for
  // it (c10d's Work::wait contract), so that stream's next event marks its end. Nothing in
  // program order, where the host waits where the result is needed.
  void order_stream_after(const WorkHandle& work) const;
  // Rethrows e as "fsdp: <what> of unit '<label>' on rank r of W failed: ...".
  [[noreturn]] void rethrow_with_context(const char* what, const std::exception& e) const;

 private:
  const std::string& label_;
  const DeviceMesh& mesh_;
  DeviceStreams* streams_;
  RuntimeObserver* observer_;
};

// The observer a unit was given, or one that ignores every report.
inline RuntimeObserver& observer_or_none(const std::shared_ptr<RuntimeObserver>& observer) {
  static RuntimeObserver none;
  return observer ? *observer : none;
}

// Reports [construction, destruction) as a span of the unit, when the observer records spans.
class SpanScope {
 public:
  SpanScope(const UnitContext& unit, const char* category, const char* name)
      : unit_(unit),
        category_(category),
        name_(name),
        recording_(unit.observer().records_spans()),
        begin_(recording_ ? RuntimeObserver::Clock::now() : RuntimeObserver::Clock::time_point{}) {}
  // See [Note: a scope reports only what it timed] (fsdp/util/trace.h).
  ~SpanScope() {
    if (recording_ && unit_.observer().records_spans()) {
      unit_.span(category_, name_, begin_, RuntimeObserver::Clock::now());
    }
  }
  SpanScope(const SpanScope&) = delete;
  SpanScope& operator=(const SpanScope&) = delete;

 private:
  const UnitContext& unit_;
  const char* category_;
  const char* name_;
  bool recording_;
  RuntimeObserver::Clock::time_point begin_;
};

}  // namespace fsdp::detail
