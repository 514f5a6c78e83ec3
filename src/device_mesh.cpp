// DeviceMesh owns nothing but shared handles; see include/fsdp/device_mesh.h.
#include <fsdp/device_mesh.h>

#include <c10/util/Exception.h>

namespace fsdp {

DeviceMesh::DeviceMesh(std::shared_ptr<ProcessGroup> group)
    : shard_group_(std::move(group)), stats_(std::make_shared<RankStats>()),
      tracer_(std::make_shared<Tracer>()) {
  TORCH_CHECK(shard_group_ != nullptr, "DeviceMesh needs a process group, got null");
}

}  // namespace fsdp
