// See dcp_hf_layout.h.
#include "checkpoint/dcp_hf_layout.h"

namespace fsdp::checkpoint::detail {

std::string dcp_state_key(const std::string& param, const std::string& kind) {
  return "state." + param + "." + kind;
}

Chunk chunk_of(const LocalParam& lp) {
  if (lp.global_shape.empty()) return {0, 0, 1, 1, 1};
  // DCP's chunks are boxes; ours are ranges along one dim, which a row split's columns under
  // FSDP's rows are not.
  TORCH_CHECK(!lp.tp, "parameter '", lp.name, "' is split by tensor parallelism along dim ",
              lp.tp ? lp.tp->placement->dim : 0, " in ", lp.tp ? lp.tp->placement->packed : 1,
              " packed block(s), not as rows: DCP-layout checkpoints of such a split are not "
              "supported yet");
  if (lp.along_dim()) {
    return {lp.shard_dim, lp.dim_offset, lp.dim_rows, lp.dim_padded, lp.global_shape[lp.shard_dim]};
  }
  return {0, lp.offset, lp.rows, lp.padded_rows, lp.dim0};
}

std::vector<int64_t> local_shape(const LocalParam& lp, const Chunk& c) {
  std::vector<int64_t> shape = lp.global_shape;
  if (!shape.empty()) shape[c.dim] = c.padded;
  return shape;
}

std::vector<int64_t> chunk_shape(const LocalParam& lp, const Chunk& c) {
  std::vector<int64_t> shape = lp.global_shape;
  if (!shape.empty()) shape[c.dim] = c.rows;
  return shape;
}

std::vector<int64_t> chunk_offsets(const LocalParam& lp, const Chunk& c) {
  std::vector<int64_t> offsets(lp.global_shape.size(), 0);
  if (!offsets.empty()) offsets[c.dim] = c.offset;
  return offsets;
}

}  // namespace fsdp::checkpoint::detail
