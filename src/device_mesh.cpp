// DeviceMesh construction; see include/fsdp/device_mesh.h for the layout of a 2-D mesh.
#include <fsdp/device_mesh.h>

#include <c10/util/Exception.h>

#include <string>
#include <vector>

namespace fsdp {
namespace {

void add(CollectiveCounters& into, const CollectiveCounters& c) {
  into.calls += c.calls;
  into.payload_bytes += c.payload_bytes;
  into.sent_bytes += c.sent_bytes;
}

}  // namespace

DeviceMesh::DeviceMesh(std::shared_ptr<ProcessGroup> group)
    : shard_group_(std::move(group)),
      stats_(std::make_shared<RankStats>()),
      tracer_(std::make_shared<Tracer>()) {
  TORCH_CHECK(shard_group_ != nullptr, "DeviceMesh needs a process group, got null");
}

DeviceMesh DeviceMesh::hybrid(const std::shared_ptr<ProcessGroup>& world, int replicate_size) {
  TORCH_CHECK(world != nullptr, "DeviceMesh::hybrid needs a process group, got null");
  const int w = world->size();
  TORCH_CHECK(replicate_size >= 1 && w % replicate_size == 0, "DeviceMesh::hybrid: replicate size ",
              replicate_size, " does not divide the world size ", w);
  const int shard = w / replicate_size;
  if (replicate_size == 1) return DeviceMesh(world);
  const int me = world->rank();
  // Every rank builds only its own two groups; members of a group call split together.
  std::vector<int> shard_ranks, replica_ranks;
  for (int i = 0; i < shard; ++i) shard_ranks.push_back(me / shard * shard + i);
  for (int i = 0; i < replicate_size; ++i) replica_ranks.push_back(me % shard + i * shard);
  auto shard_group = world->split(shard_ranks, "mesh" + std::to_string(replicate_size) + "x" +
                                                   std::to_string(shard) + "/shard" +
                                                   std::to_string(me / shard));
  auto replicate_group = world->split(replica_ranks, "mesh" + std::to_string(replicate_size) + "x" +
                                                         std::to_string(shard) + "/replicate" +
                                                         std::to_string(me % shard));
  TORCH_INTERNAL_ASSERT(shard_group && replicate_group);
  DeviceMesh mesh(std::move(shard_group));
  mesh.replicate_group_ = std::move(replicate_group);
  return mesh;
}

CommCounters DeviceMesh::counters() const {
  CommCounters total = shard_group_->counters();
  if (replicate_group_) {
    const CommCounters r = replicate_group_->counters();
    add(total.all_gather, r.all_gather);
    add(total.reduce_scatter, r.reduce_scatter);
    add(total.all_reduce, r.all_reduce);
    add(total.broadcast, r.broadcast);
  }
  return total;
}

void DeviceMesh::reset_counters() const {
  shard_group_->reset_counters();
  if (replicate_group_) replicate_group_->reset_counters();
}

}  // namespace fsdp
