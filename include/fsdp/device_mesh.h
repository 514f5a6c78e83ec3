// DeviceMesh: the ranks a module is sharded over. (What the units sharded on it hold and when
// they run is reported to their observer, not kept here: fsdp/runtime/observer.h.)
//
// A 1-D mesh shards over every rank of a group. A 2-D mesh (replicate x shard, HSDP) splits the
// world into replicate_size groups of consecutive ranks: parameters are sharded within a shard
// group and replicated across the groups, and gradients, once reduce-scattered in the shard
// group, are all-reduced across the replicate group. replicate_size == world size is plain
// data parallelism (DDP): shard groups of one rank, nothing sharded.
//
// A mesh is a cheap, copyable handle; copies share the same process groups.
#pragma once

#include <fsdp/comm/process_group.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace fsdp {

class DeviceMesh {
 public:
  // A 1-D mesh over every rank of group. dim_name names it in errors when it is a dimension of a
  // larger mesh (NamedMesh's "tp"). (optional) defaults to none.
  explicit DeviceMesh(std::shared_ptr<ProcessGroup> group, std::string dim_name = "");

  // A replicate_size x (W / replicate_size) mesh over world. Collective over every rank of
  // world; throws naming both numbers if replicate_size does not divide W.
  static DeviceMesh hybrid(const std::shared_ptr<ProcessGroup>& world, int replicate_size);

  int ndim() const { return replicate_group_ ? 2 : 1; }
  // Size of the shard dimension, and this rank's coordinate in it.
  int shard_size() const { return shard_group_->size(); }
  int shard_rank() const { return shard_group_->rank(); }
  // Size of the replicate dimension (1 for a 1-D mesh), and this rank's coordinate in it.
  int replicate_size() const { return replicate_group_ ? replicate_group_->size() : 1; }
  int replicate_rank() const { return replicate_group_ ? replicate_group_->rank() : 0; }
  c10::Device device() const { return shard_group_->device(); }
  // The name it was made with ("" for none).
  const std::string& name() const { return name_; }

  ProcessGroup& shard_group() const { return *shard_group_; }
  const std::shared_ptr<ProcessGroup>& shard_group_ptr() const { return shard_group_; }
  // The replicate dimension's group, or nullptr for a 1-D mesh.
  ProcessGroup* replicate_group() const { return replicate_group_.get(); }

  // The group of `size` consecutive ranks of the shard group that holds this rank: where a unit
  // with reshard_after_forward = size gathers for backward (ZeRO++ hpZ). Created on first use
  // for each size, which is collective over the shard group (every rank asks for the same
  // size at the same point, as fully_shard does); copies of the mesh share the groups. size
  // must divide shard_size().
  std::shared_ptr<ProcessGroup> post_forward_group(int size) const;

  // The side groups: one more group over the shard group's ranks and one over the replicate
  // group's (null for a 1-D mesh), each with a progress queue of its own, for the collectives
  // of a lookup from shards (see [Note: a lookup's collectives on side groups] in
  // src/runtime/sharded_lookup.cpp). Made on first use, which is collective over the mesh (every
  // rank asks at the same point); copies of the mesh share them. A shard group of one rank is its
  // own side group.
  struct SideGroups {
    std::shared_ptr<ProcessGroup> shard;
    std::shared_ptr<ProcessGroup> replicate;
  };
  const SideGroups& side_groups() const;

  // Communication counters summed over the mesh's groups, and their reset.
  CommCounters counters() const;
  void reset_counters() const;

 private:
  // Every group of the mesh: shard, replicate (if any), post-forward and side groups made so far.
  std::vector<ProcessGroup*> groups() const;

  std::shared_ptr<ProcessGroup> shard_group_;
  std::shared_ptr<ProcessGroup> replicate_group_;
  std::shared_ptr<std::map<int, std::shared_ptr<ProcessGroup>>> post_forward_groups_;
  std::shared_ptr<SideGroups> side_groups_;
  std::string name_;
};

}  // namespace fsdp
