// What the writer and the reader of DCP's Hugging Face layout (dcp_hf_save.cpp,
// dcp_hf_load.cpp) share: the optimizer's key names and where a rank's part of a parameter
// sits in the global tensor.
//
// [Note: a parameter's chunk] A rank holds a box of each parameter's global tensor: a range of
// one dimension `dim` (dim 0 for Shard(0) and for parameters every rank holds whole,
// FullyShardOptions' shard dim for Shard(d > 0)) and everything of the others. Its local tensor
// (the parameter, or an AdamW state of the same shape) viewed as local_shape() holds that
// range's `rows` slices first, then padding up to `padded`. DCP stores the same box, without
// the padding, as one chunk with offsets `offset` along dim and 0 elsewhere: what FSDP2 stores
// for its DTensor shard.
#pragma once

#include "checkpoint/common.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::checkpoint::detail {

// "state.<parameter>.<kind>": the keys of get_optimizer_state_dict(...,
// flatten_optimizer_state_dict=True), for kind exp_avg, exp_avg_sq, max_exp_avg_sq or step.
std::string dcp_state_key(const std::string& param, const std::string& kind);

struct Chunk {
  int64_t dim = 0;     // the dimension this rank holds a range of (0 for a 0-D tensor)
  int64_t offset = 0;  // first slice of that range
  int64_t rows = 0;    // real slices
  int64_t padded = 0;  // slices of the local tensor along dim, padding included
  int64_t size = 1;    // the global tensor's size along dim (1 for 0-D)
};
Chunk chunk_of(const LocalParam& lp);

// The local tensor's shape with padding: the global shape with dim's size `padded`.
std::vector<int64_t> local_shape(const LocalParam& lp, const Chunk& c);
// The chunk's stored shape (rows instead of padded) and offsets in the global tensor.
std::vector<int64_t> chunk_shape(const LocalParam& lp, const Chunk& c);
std::vector<int64_t> chunk_offsets(const LocalParam& lp, const Chunk& c);

}  // namespace fsdp::checkpoint::detail
