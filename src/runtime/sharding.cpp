// Dim-0 shard layout; see include/fsdp/runtime/sharding.h for the convention.
#include <fsdp/runtime/sharding.h>

#include <c10/util/Exception.h>

#include <algorithm>

namespace fsdp {

std::vector<int64_t> DimShardLayout::padded_shape(c10::IntArrayRef global_shape) const {
  if (global_shape.empty()) return {chunk_rows};
  std::vector<int64_t> shape(global_shape.begin(), global_shape.end());
  shape[0] = chunk_rows;
  return shape;
}

DimShardLayout shard_layout(c10::IntArrayRef global_shape, int rank, int world) {
  TORCH_CHECK(world >= 1, "shard_layout: world size must be >= 1, got ", world);
  TORCH_CHECK(rank >= 0 && rank < world, "shard_layout: rank ", rank, " outside [0, ", world, ")");
  DimShardLayout layout;
  layout.dim0 = global_shape.empty() ? 1 : global_shape[0];
  int64_t numel = 1;
  for (int64_t d : global_shape) numel *= d;
  layout.row_numel = layout.dim0 == 0 ? 0 : numel / layout.dim0;
  if (layout.dim0 == 0) {
    // An empty parameter still gets one (empty) row per rank so every shape stays valid.
    layout.row_numel = 1;
    for (size_t i = 1; i < global_shape.size(); ++i) layout.row_numel *= global_shape[i];
  }
  layout.chunk_rows = (layout.dim0 + world - 1) / world;
  layout.local_offset = std::min<int64_t>(layout.dim0, rank * layout.chunk_rows);
  layout.local_rows =
      std::min<int64_t>(layout.dim0, layout.local_offset + layout.chunk_rows) - layout.local_offset;
  return layout;
}

DimShardLayout whole_tensor_layout(c10::IntArrayRef global_shape, bool owned) {
  DimShardLayout layout = shard_layout(global_shape, /*rank=*/0, /*world=*/1);
  if (!owned) layout.chunk_rows = layout.local_rows = 0;
  return layout;
}

}  // namespace fsdp
