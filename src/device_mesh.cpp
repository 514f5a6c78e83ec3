// DeviceMesh construction; see include/fsdp/device_mesh.h for the layout of a 2-D mesh.
#include <fsdp/device_mesh.h>

#include <c10/util/Exception.h>

#include <numeric>
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

DeviceMesh::DeviceMesh(std::shared_ptr<ProcessGroup> group, std::string dim_name)
    : shard_group_(std::move(group)),
      post_forward_groups_(std::make_shared<std::map<int, std::shared_ptr<ProcessGroup>>>()),
      side_groups_(std::make_shared<SideGroups>()),
      name_(std::move(dim_name)) {
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
  auto shard_group =
      world->split(shard_ranks, "mesh" + std::to_string(replicate_size) + "x" +
                                    std::to_string(shard) + "/shard" + std::to_string(me / shard));
  auto replicate_group = world->split(replica_ranks, "mesh" + std::to_string(replicate_size) + "x" +
                                                         std::to_string(shard) + "/replicate" +
                                                         std::to_string(me % shard));
  TORCH_INTERNAL_ASSERT(shard_group && replicate_group);
  DeviceMesh mesh(std::move(shard_group));
  mesh.replicate_group_ = std::move(replicate_group);
  return mesh;
}

std::shared_ptr<ProcessGroup> DeviceMesh::post_forward_group(int size) const {
  const int w = shard_size();
  TORCH_CHECK(size >= 1 && w % size == 0, "DeviceMesh: a post-forward group of ", size,
              " ranks does not divide the shard group of ", w, " ranks");
  if (size == w) return shard_group_;
  auto& group = (*post_forward_groups_)[size];
  if (!group) {
    const int me = shard_rank();
    std::vector<int> ranks;
    for (int i = 0; i < size; ++i) ranks.push_back(me / size * size + i);
    group = shard_group_->split(
        ranks, "post_forward" + std::to_string(size) + "/" + std::to_string(me / size));
    TORCH_INTERNAL_ASSERT(group);
  }
  return group;
}

const DeviceMesh::SideGroups& DeviceMesh::side_groups() const {
  if (side_groups_->shard) return *side_groups_;
  const auto every_rank = [](int size) {
    std::vector<int> ranks(size);
    std::iota(ranks.begin(), ranks.end(), 0);
    return ranks;
  };
  SideGroups made;
  made.shard =
      shard_size() == 1 ? shard_group_ : shard_group_->split(every_rank(shard_size()), "side");
  if (replicate_group_) {
    made.replicate = replicate_group_->split(every_rank(replicate_size()), "side");
  }
  TORCH_INTERNAL_ASSERT(made.shard && (made.replicate || !replicate_group_));
  *side_groups_ = std::move(made);
  return *side_groups_;
}

std::vector<ProcessGroup*> DeviceMesh::groups() const {
  std::vector<ProcessGroup*> all{shard_group_.get()};
  if (replicate_group_) all.push_back(replicate_group_.get());
  for (const auto& item : *post_forward_groups_) all.push_back(item.second.get());
  // A shard group of one rank is its own side group: counted once.
  if (side_groups_->shard && side_groups_->shard != shard_group_) {
    all.push_back(side_groups_->shard.get());
  }
  if (side_groups_->replicate) all.push_back(side_groups_->replicate.get());
  return all;
}

CommCounters DeviceMesh::counters() const {
  CommCounters total;
  for (ProcessGroup* group : groups()) {
    const CommCounters c = group->counters();
    add(total.all_gather, c.all_gather);
    add(total.reduce_scatter, c.reduce_scatter);
    add(total.all_reduce, c.all_reduce);
    add(total.broadcast, c.broadcast);
    add(total.reduce, c.reduce);
    total.waited_s += c.waited_s;
    total.busy_s += c.busy_s;
  }
  return total;
}

void DeviceMesh::reset_counters() const {
  for (ProcessGroup* group : groups()) group->reset_counters();
}

}  // namespace fsdp
