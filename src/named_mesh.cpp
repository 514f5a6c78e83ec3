// NamedMesh construction: row-major coordinates, one split per dimension. See
// include/fsdp/named_mesh.h for the layout.
#include <fsdp/named_mesh.h>

#include <c10/util/Exception.h>

#include <set>
#include <string>
#include <vector>

namespace fsdp {
namespace {

std::string describe(const std::vector<MeshDim>& dims) {
  std::string out;
  for (const MeshDim& d : dims)
    out += (out.empty() ? "" : " x ") + d.name + " " + std::to_string(d.size);
  return out;
}

void check_dims(const std::vector<MeshDim>& dims, int world_size) {
  TORCH_CHECK(!dims.empty(), "NamedMesh: needs at least one dimension");
  std::set<std::string> names;
  int64_t product = 1;
  for (const MeshDim& d : dims) {
    TORCH_CHECK(!d.name.empty(), "NamedMesh: a dimension has no name (", describe(dims), ")");
    TORCH_CHECK(names.insert(d.name).second, "NamedMesh: dimension name '", d.name,
                "' appears twice (", describe(dims), ")");
    TORCH_CHECK(d.size >= 1, "NamedMesh: dimension '", d.name, "' has size ", d.size,
                ", not at least 1");
    product *= d.size;
  }
  TORCH_CHECK(product == world_size, "NamedMesh: the dimensions (", describe(dims), ") hold ",
              product, " ranks, but the world has ", world_size);
}

}  // namespace

NamedMesh::NamedMesh(const std::shared_ptr<ProcessGroup>& world, std::vector<MeshDim> dims)
    : world_(world), dims_(std::move(dims)) {
  TORCH_CHECK(world_ != nullptr, "NamedMesh needs a process group, got null");
  check_dims(dims_, world_->size());
  const int me = world_->rank();
  std::vector<int> strides(dims_.size(), 1);
  for (size_t i = dims_.size() - 1; i > 0; --i) strides[i - 1] = strides[i] * dims_[i].size;
  const std::string layout = describe(dims_);
  for (size_t i = 0; i < dims_.size(); ++i) {
    const int coordinate = me / strides[i] % dims_[i].size;
    const int first = me - coordinate * strides[i];  // this group's rank at coordinate 0
    std::vector<int> ranks;
    for (int c = 0; c < dims_[i].size; ++c) ranks.push_back(first + c * strides[i]);
    coordinates_.push_back(coordinate);
    if (dims_[i].size == world_->size()) {
      groups_.push_back(world_);
      continue;
    }
    // Named by the layout, the dimension and the group's first rank: unique among the splits.
    auto group =
        world_->split(ranks, "mesh " + layout + "/" + dims_[i].name + "@" + std::to_string(first));
    TORCH_INTERNAL_ASSERT(group != nullptr, "NamedMesh: rank ", me, " is not in its own group");
    groups_.push_back(std::move(group));
  }
}

size_t NamedMesh::index_of(const std::string& name) const {
  for (size_t i = 0; i < dims_.size(); ++i) {
    if (dims_[i].name == name) return i;
  }
  TORCH_CHECK(false, "NamedMesh: no dimension named '", name, "' in the mesh (", describe(dims_),
              ")");
}

DeviceMesh NamedMesh::operator[](const std::string& name) const {
  return DeviceMesh(groups_[index_of(name)], name);
}

const std::shared_ptr<ProcessGroup>& NamedMesh::group(const std::string& name) const {
  return groups_[index_of(name)];
}

int NamedMesh::size(const std::string& name) const { return dims_[index_of(name)].size; }

int NamedMesh::coordinate(const std::string& name) const { return coordinates_[index_of(name)]; }

}  // namespace fsdp
