// UnitContext: what the parts of one FSDP unit share. A unit is its state machine (ParamGroup),
// the placement that unshards its parameters (Unsharder) and the reducer of its gradients
// (GradientReducer); each names the unit the same way in errors, counts its bytes and times on
// the same mesh, orders its work on the streams of the tree the unit belongs to, and waits on a
// collective the same way. The context holds references to the unit's own label and mesh (the
// unit outlives its parts, and is never moved), and the tree's streams, re-bound when the unit
// joins a tree.
#pragma once

#include "runtime/device_streams.h"

#include <fsdp/comm/process_group.h>
#include <fsdp/device_mesh.h>

#include <ATen/core/Tensor.h>

#include <exception>
#include <string>

namespace fsdp::detail {

class UnitContext {
 public:
  UnitContext(const std::string& label, const DeviceMesh& mesh, DeviceStreams& streams)
      : label_(label), mesh_(mesh), streams_(&streams) {}
  UnitContext(const UnitContext&) = delete;
  UnitContext& operator=(const UnitContext&) = delete;

  // For error messages: the unit's path under the root, or its module's type name.
  const std::string& label() const { return label_; }
  const DeviceMesh& mesh() const { return mesh_; }
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
};

}  // namespace fsdp::detail
