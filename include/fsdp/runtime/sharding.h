// Shard(d) arithmetic with padding, FSDP2's per-parameter placement.
//
// A parameter is viewed as [outer, dim_size, inner] around its shard dim d (outer: the product
// of the sizes before d, 1 under Shard(0); inner: the product of those after it). Along d it is
// split into W chunks of chunk_rows = ceil(dim_size / W) "rows" (slices along d; real rows when
// d = 0), as torch.chunk(tensor, W, d) with empty chunks appended: rank r owns slices
// [r * chunk_rows, ...) clipped to dim_size, so the last ranks may own fewer, or none when
// dim_size < W. Every rank stores a padded shard of shape [outer, chunk_rows, inner] (the global
// shape with d's size replaced by chunk_rows), which makes all shards the same size and lets
// one flat all-gather of the padded shards rebuild every parameter. A 0-D parameter is sharded
// as a 1-element vector.
#pragma once

#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <vector>

namespace fsdp {

struct DimShardLayout {
  int64_t dim = 0;           // the shard dim, in [0, ndim) (0 for a 0-D tensor)
  int64_t outer = 1;         // elements before dim: product of the sizes in front of it
  int64_t dim_size = 1;      // size of the global tensor along dim (1 for a 0-D tensor)
  int64_t inner = 1;         // elements per slice along dim: product of the sizes after it
  int64_t chunk_rows = 1;    // ceil(dim_size / W): slices along dim of every padded shard
  int64_t local_offset = 0;  // first global slice of this rank (clipped to dim_size)
  int64_t local_rows = 0;    // real slices this rank holds, in [0, chunk_rows]

  int64_t numel() const { return outer * dim_size * inner; }
  int64_t padded_numel() const { return outer * chunk_rows * inner; }
  // Shape of the padded local shard: global shape with dim's size replaced by chunk_rows.
  std::vector<int64_t> padded_shape(c10::IntArrayRef global_shape) const;
};

// Layout of rank's shard of a tensor of global_shape over world ranks, along dim (Shard(dim)):
// dim must already be normalised into [0, ndim) (0 for a 0-D tensor).
DimShardLayout shard_layout(c10::IntArrayRef global_shape, int rank, int world, int64_t dim = 0);

// Layout under a whole-tensor placement (fsdp/runtime/whole_tensor.h): the owner holds every
// row (chunk_rows = local_rows = dim_size), any other rank none (chunk_rows = local_rows = 0).
DimShardLayout whole_tensor_layout(c10::IntArrayRef global_shape, bool owned);

}  // namespace fsdp
