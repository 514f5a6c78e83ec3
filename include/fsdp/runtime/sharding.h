// Dim-0 sharding arithmetic, FSDP2's Shard(0) with padding.
//
// A parameter with dim0 rows of row_numel elements each is split into W chunks of
// chunk_rows = ceil(dim0 / W) rows. Rank r owns global rows [r * chunk_rows, ...) clipped to
// dim0, so the last ranks may own fewer rows, or none when dim0 < W. Every rank stores a
// padded shard of exactly chunk_rows rows, which makes all shards the same size and lets one
// flat all-gather of the padded shards rebuild every parameter. A 0-D parameter is sharded as
// a 1-element vector.
#pragma once

#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <vector>

namespace fsdp {

struct DimShardLayout {
  int64_t dim0 = 1;          // rows of the global tensor (1 for a 0-D tensor)
  int64_t row_numel = 1;     // elements per row
  int64_t chunk_rows = 1;    // ceil(dim0 / W): rows of every padded shard
  int64_t local_offset = 0;  // first global row of this rank (clipped to dim0)
  int64_t local_rows = 0;    // real rows this rank holds, in [0, chunk_rows]

  int64_t padded_numel() const { return chunk_rows * row_numel; }
  // Shape of the padded local shard: global shape with dim 0 replaced by chunk_rows.
  std::vector<int64_t> padded_shape(c10::IntArrayRef global_shape) const;
};

// Layout of rank's shard of a tensor of global_shape over world ranks.
DimShardLayout shard_layout(c10::IntArrayRef global_shape, int rank, int world);

// Layout under a whole-tensor placement (fsdp/runtime/whole_tensor.h): the owner holds every
// row (chunk_rows = local_rows = dim0), any other rank none (chunk_rows = local_rows = 0).
DimShardLayout whole_tensor_layout(c10::IntArrayRef global_shape, bool owned);

}  // namespace fsdp
