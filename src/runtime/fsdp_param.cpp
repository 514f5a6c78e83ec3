// FSDPParam: data movement between a parameter's shard and its full value.
//
// Invariants: while sharded, param_ aliases sharded_ and unsharded_ has a 0-byte storage;
// while unsharded, param_ aliases unsharded_ (same StorageImpl as every earlier unshard).
// unsharded_ lives on the mesh's device and is freed and re-filled in place through
// fsdp/runtime/storage.h; sharded_ lives there too, or on the host with CPU offload.
#include "runtime/fsdp_param.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <fsdp/runtime/storage.h>

#include <algorithm>

namespace fsdp::detail {

FSDPParam::FSDPParam(std::string name, at::Tensor param, int rank, int world,
                     at::ScalarType compute_dtype, int64_t shard_dim)
    : FSDPParam(std::move(name), param, shard_layout(param.sizes(), rank, world, shard_dim),
                compute_dtype) {}

FSDPParam::FSDPParam(std::string name, at::Tensor param, DimShardLayout layout,
                     at::ScalarType compute_dtype)
    : name_(std::move(name)),
      param_(std::move(param)),
      global_shape_(param_.sizes().begin(), param_.sizes().end()),
      layout_(layout) {
  unsharded_ = at::empty(global_shape_, param_.options().dtype(compute_dtype).requires_grad(false));
  resize_storage(unsharded_, 0);
}

ShardMetadata FSDPParam::metadata(int rank, int world) const {
  ShardMetadata m;
  m.global_shape = global_shape_;
  m.shard_dim = layout_.dim;
  m.local_offset = layout_.local_offset;
  m.local_rows = layout_.local_rows;
  m.padded_rows = layout_.chunk_rows;
  m.mesh_rank = rank;
  m.mesh_size = world;
  return m;
}

int64_t FSDPParam::unsharded_bytes() const {
  return layout_.numel() * static_cast<int64_t>(unsharded_.element_size());
}

// Tensors are addressed as [outer, rows, inner] around the shard dim: under Shard(0) outer is 1
// and every copy below is one contiguous block, as a plain row copy would be; under Shard(d > 0)
// the same copies are strided (one block of inner elements per outer index).
static at::Tensor as_3d(const at::Tensor& t, const DimShardLayout& l, int64_t rows) {
  return t.view({l.outer, rows, l.inner});
}

void FSDPParam::copy_local_rows_into(const at::Tensor& full, const at::Tensor& shard) const {
  const at::Tensor rows = as_3d(shard, layout_, layout_.chunk_rows);
  if (layout_.local_rows > 0) {
    rows.narrow(1, 0, layout_.local_rows)
        .copy_(full.reshape({layout_.outer, layout_.dim_size, layout_.inner})
                   .narrow(1, layout_.local_offset, layout_.local_rows));
  }
  if (layout_.local_rows < layout_.chunk_rows) {
    rows.narrow(1, layout_.local_rows, layout_.chunk_rows - layout_.local_rows).zero_();
  }
}

void FSDPParam::init_sharded(const at::Tensor& flat_slice) {
  TORCH_INTERNAL_ASSERT(flat_slice.numel() == padded_numel());
  {
    at::NoGradGuard no_grad;
    copy_local_rows_into(param_, flat_slice);
  }
  sharded_ = flat_slice.view(layout_.padded_shape(global_shape_));
  param_.set_data(sharded_);
  unsharded_now_ = false;
}

// Copies a [W, outer, chunk_rows, inner] gathered view into dst ([outer, dim_size, inner]):
// along the shard dim the W chunks laid end to end are the global tensor followed by padding.
static void copy_chunks_to_rows(const at::Tensor& chunks, const at::Tensor& dst,
                                const DimShardLayout& l) {
  if (l.chunk_rows == 0) return;
  const int64_t full_chunks = l.dim_size / l.chunk_rows;
  if (full_chunks > 0) {
    dst.narrow(1, 0, full_chunks * l.chunk_rows)
        .view({l.outer, full_chunks, l.chunk_rows, l.inner})
        .copy_(chunks.narrow(0, 0, full_chunks).transpose(0, 1));
  }
  const int64_t rest = l.dim_size - full_chunks * l.chunk_rows;
  if (rest > 0) {
    dst.narrow(1, full_chunks * l.chunk_rows, rest)
        .copy_(chunks.select(0, full_chunks).narrow(1, 0, rest));
  }
}

void FSDPParam::unshard_from(const at::Tensor& gathered_2d, int64_t column) {
  TORCH_INTERNAL_ASSERT(!unsharded_now_, "parameter ", name_, " is already unsharded");
  resize_storage(unsharded_, static_cast<size_t>(unsharded_bytes()));
  const int64_t world = gathered_2d.size(0);
  const at::Tensor chunks = gathered_2d.narrow(1, column, padded_numel())
                                .view({world, layout_.outer, layout_.chunk_rows, layout_.inner});
  {
    at::NoGradGuard no_grad;
    copy_chunks_to_rows(chunks, as_3d(unsharded_, layout_, layout_.dim_size), layout_);
  }
  param_.set_data(unsharded_);
  unsharded_now_ = true;
}

void FSDPParam::unshard_from_flat(const at::Tensor& flat) {
  TORCH_INTERNAL_ASSERT(!unsharded_now_, "parameter ", name_, " is already unsharded");
  TORCH_INTERNAL_ASSERT(flat.numel() == layout_.numel());
  resize_storage(unsharded_, static_cast<size_t>(unsharded_bytes()));
  {
    at::NoGradGuard no_grad;
    unsharded_.view({-1}).copy_(flat.view({-1}));
  }
  param_.set_data(unsharded_);
  unsharded_now_ = true;
}

void FSDPParam::unshard_single_rank() {
  TORCH_INTERNAL_ASSERT(!unsharded_now_, "parameter ", name_, " is already unsharded");
  TORCH_INTERNAL_ASSERT(layout_.chunk_rows == layout_.dim_size,
                        "unshard_single_rank needs one rank");
  at::NoGradGuard no_grad;
  param_.set_data(sharded_.view(global_shape_));
  unsharded_now_ = true;
  aliases_shard_ = true;
}

void FSDPParam::reshard() {
  if (!unsharded_now_) return;
  param_.set_data(sharded_);
  if (!aliases_shard_) resize_storage(unsharded_, 0);
  unsharded_now_ = false;
  aliases_shard_ = false;
}

void FSDPParam::copy_chunks_into(const at::Tensor& full, const at::Tensor& slot_2d,
                                 int64_t first_chunk) const {
  const DimShardLayout& l = layout_;
  if (l.chunk_rows == 0) return;
  const int64_t count = slot_2d.size(0);
  // The slot is a column range of a [count, S] buffer, so it is strided by chunk: address it
  // as [count, outer, chunk_rows, inner], the mirror image of unshard_from.
  const at::Tensor chunks = slot_2d.view({count, l.outer, l.chunk_rows, l.inner});
  // Real slices from the first chunk on; chunks past them are padding.
  const int64_t first_row = std::min(first_chunk * l.chunk_rows, l.dim_size);
  const int64_t rows = l.dim_size - first_row;
  const at::Tensor src = full.reshape({l.outer, l.dim_size, l.inner}).narrow(1, first_row, rows);
  const int64_t full_chunks = std::min(rows / l.chunk_rows, count);
  if (full_chunks > 0) {
    chunks.narrow(0, 0, full_chunks)
        .copy_(src.narrow(1, 0, full_chunks * l.chunk_rows)
                   .view({l.outer, full_chunks, l.chunk_rows, l.inner})
                   .transpose(0, 1));
  }
  if (full_chunks < count) {
    const int64_t rest = rows - full_chunks * l.chunk_rows;  // < chunk_rows
    const at::Tensor partial = chunks.select(0, full_chunks);
    if (rest > 0) {
      partial.narrow(1, 0, rest).copy_(src.narrow(1, full_chunks * l.chunk_rows, rest));
    }
    partial.narrow(1, rest, l.chunk_rows - rest).zero_();
    if (full_chunks + 1 < count) chunks.narrow(0, full_chunks + 1, count - full_chunks - 1).zero_();
  }
}

}  // namespace fsdp::detail
