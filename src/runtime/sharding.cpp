// Shard(d) layout; see include/fsdp/runtime/sharding.h for the convention.
#include <fsdp/runtime/sharding.h>

#include <c10/util/Exception.h>

#include <algorithm>

namespace fsdp {

std::vector<int64_t> DimShardLayout::padded_shape(c10::IntArrayRef global_shape) const {
  if (global_shape.empty()) return {chunk_rows};
  std::vector<int64_t> shape(global_shape.begin(), global_shape.end());
  shape[dim] = chunk_rows;
  return shape;
}

DimShardLayout shard_layout(c10::IntArrayRef global_shape, int rank, int world, int64_t dim) {
  TORCH_CHECK(world >= 1, "shard_layout: world size must be >= 1, got ", world);
  TORCH_CHECK(rank >= 0 && rank < world, "shard_layout: rank ", rank, " outside [0, ", world, ")");
  const auto ndim = static_cast<int64_t>(global_shape.size());
  TORCH_CHECK(dim >= 0 && dim < std::max<int64_t>(ndim, 1), "shard_layout: shard dim ", dim,
              " outside [0, ", std::max<int64_t>(ndim, 1), ") for shape ", global_shape);
  DimShardLayout layout;
  layout.dim = dim;
  layout.dim_size = global_shape.empty() ? 1 : global_shape[dim];
  // Products over the sizes around dim, not numel / dim_size: an empty dimension elsewhere
  // must still leave every shape valid.
  for (int64_t i = 0; i < dim; ++i) layout.outer *= global_shape[i];
  for (int64_t i = dim + 1; i < ndim; ++i) layout.inner *= global_shape[i];
  layout.chunk_rows = (layout.dim_size + world - 1) / world;
  layout.local_offset = std::min<int64_t>(layout.dim_size, rank * layout.chunk_rows);
  layout.local_rows = std::min<int64_t>(layout.dim_size, layout.local_offset + layout.chunk_rows) -
                      layout.local_offset;
  return layout;
}

DimShardLayout whole_tensor_layout(c10::IntArrayRef global_shape, bool owned) {
  DimShardLayout layout = shard_layout(global_shape, /*rank=*/0, /*world=*/1);
  if (!owned) layout.chunk_rows = layout.local_rows = 0;
  return layout;
}

}  // namespace fsdp
