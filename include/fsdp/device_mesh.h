// DeviceMesh: the ranks a module is sharded over, and the per-rank accounting and timeline that
// every unit sharded on this mesh reports into.
//
// A mesh is a cheap, copyable handle; copies share the same process group and RankStats.
// Today meshes are 1-D (one shard dimension).
#pragma once

#include <fsdp/comm/process_group.h>
#include <fsdp/runtime/stats.h>
#include <fsdp/runtime/trace.h>

#include <memory>

namespace fsdp {

class DeviceMesh {
 public:
  // A 1-D mesh over every rank of group.
  explicit DeviceMesh(std::shared_ptr<ProcessGroup> group);

  int ndim() const { return 1; }
  // Size of the shard dimension, and this rank's coordinate in it.
  int shard_size() const { return shard_group_->size(); }
  int shard_rank() const { return shard_group_->rank(); }
  c10::Device device() const { return shard_group_->device(); }

  ProcessGroup& shard_group() const { return *shard_group_; }
  const std::shared_ptr<ProcessGroup>& shard_group_ptr() const { return shard_group_; }

  // Bytes this rank holds, by category; shared by all units on this mesh.
  RankStats& stats() const { return *stats_; }
  // This rank's timeline; records nothing until enabled.
  Tracer& tracer() const { return *tracer_; }

 private:
  std::shared_ptr<ProcessGroup> shard_group_;
  std::shared_ptr<RankStats> stats_;
  std::shared_ptr<Tracer> tracer_;
};

}  // namespace fsdp
