// NamedMesh: the world split into named dimensions, for composing parallelisms (FSDP over "dp",
// tensor parallelism over "tp"), as FSDP2's init_device_mesh(mesh_shape, mesh_dim_names).
//
// Layout: row-major over the dimensions in the order given, the last innermost, so that the
// last dimension's groups are consecutive ranks. With {"dp", 2}, {"tp", 2} over 4 ranks, the tp
// groups are {0, 1} and {2, 3} (inside a host, where tensor parallelism's per-layer collectives
// belong) and the dp groups {0, 2} and {1, 3}.
//
// Each dimension's group is made once, at construction; mesh[name] is a 1-D DeviceMesh over it,
// which fully_shard takes as any other mesh. HSDP's 2-D mesh (DeviceMesh::hybrid) is a different
// thing: one FSDP dimension split into replicate x shard.
#pragma once

#include <fsdp/device_mesh.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace fsdp {

struct MeshDim {
  std::string name;
  int size = 1;
};

class NamedMesh {
 public:
  // Splits world into dims (their sizes multiply to world->size(), names unique and non-empty).
  // Collective over every rank of world. Throws naming the sizes or the name at fault.
  NamedMesh(const std::shared_ptr<ProcessGroup>& world, std::vector<MeshDim> dims);

  // The 1-D mesh over dimension name's group that holds this rank. Throws for an unknown name,
  // listing the mesh's names.
  DeviceMesh operator[](const std::string& name) const;
  const std::shared_ptr<ProcessGroup>& group(const std::string& name) const;
  int size(const std::string& name) const;
  // This rank's coordinate along dimension name.
  int coordinate(const std::string& name) const;
  const std::vector<MeshDim>& dims() const { return dims_; }
  const std::shared_ptr<ProcessGroup>& world() const { return world_; }

 private:
  size_t index_of(const std::string& name) const;

  std::shared_ptr<ProcessGroup> world_;
  std::vector<MeshDim> dims_;
  std::vector<std::shared_ptr<ProcessGroup>> groups_;
  std::vector<int> coordinates_;
};

}  // namespace fsdp
