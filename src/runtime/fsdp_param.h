// FSDPParam: one sharded parameter.
//
// The parameter Variable the module registered (param_) keeps its autograd identity for the
// module's whole life. Its data is switched with set_data between
//   - sharded_:   the padded local shard, a view into the unit's flat shard buffer (what the
//                 optimizer sees and updates in place), and
//   - unsharded_: a tensor of the global shape whose storage is freed (0 bytes) while sharded
//                 and re-filled in place by each all-gather.
// unsharded_ keeps the same StorageImpl forever: autograd saves views of the parameter during
// forward, and those views must see the re-gathered values in backward.
#pragma once

#include <fsdp/fully_shard.h>
#include <fsdp/runtime/sharding.h>

#include <ATen/core/Tensor.h>

#include <string>

namespace fsdp::detail {

class FSDPParam {
 public:
  // param must hold the full (global) value; it is not modified here. compute_dtype is the
  // dtype of the unsharded parameter (the mixed-precision param_dtype, or param's own).
  // shard_dim is its Shard(dim) placement, normalised into [0, ndim) (0 for a 0-D parameter).
  FSDPParam(std::string name, at::Tensor param, int rank, int world, at::ScalarType compute_dtype,
            int64_t shard_dim = 0);
  // The same with the layout given: under a whole-tensor placement (whole_tensor_layout) the
  // owner's "shard" is the whole tensor and every other rank's is empty.
  FSDPParam(std::string name, at::Tensor param, DimShardLayout layout,
            at::ScalarType compute_dtype);

  const std::string& name() const { return name_; }
  at::Tensor& param() { return param_; }
  const at::Tensor& param() const { return param_; }
  const std::vector<int64_t>& global_shape() const { return global_shape_; }
  const DimShardLayout& layout() const { return layout_; }
  ShardMetadata metadata(int rank, int world) const;
  bool requires_grad() const { return param_.requires_grad(); }
  int64_t padded_numel() const { return layout_.padded_numel(); }
  // Bytes of the unsharded parameter, in the compute dtype.
  int64_t unsharded_bytes() const;
  at::ScalarType compute_dtype() const { return unsharded_.scalar_type(); }

  // Copies this rank's rows (slices along the shard dim) of the full value into shard (a flat
  // slice of padded_numel() elements, the padded shard in row-major order), zeroing the padding.
  void copy_local_rows_into(const at::Tensor& full, const at::Tensor& shard) const;

  // Adopts a flat slice of the unit's shard buffer as the sharded data and points the
  // parameter at it. Called once by fully_shard.
  void init_sharded(const at::Tensor& flat_slice);

  // Re-fills the unsharded storage from an all-gather output laid out as [W, unit_numel]
  // (this parameter occupies columns [column, column + padded_numel())) and points the
  // parameter at the full tensor.
  void unshard_from(const at::Tensor& gathered_2d, int64_t column);
  // With one rank the shard is the whole tensor: points the parameter at it, in the global
  // shape, with no copy and no allocation.
  void unshard_single_rank();
  // Re-fills the unsharded storage from flat (numel() elements of the global tensor, row-major,
  // in the compute dtype: a whole-tensor broadcast's buffer) and points the parameter at it.
  void unshard_from_flat(const at::Tensor& flat);
  // Points the parameter back at its shard and frees the unsharded storage.
  void reshard();
  bool is_unsharded() const { return unsharded_now_; }
  // The padded local shard (layout().padded_shape of the global shape), whatever the parameter
  // points at now: the values the optimizer steps, which a lookup from shards reads
  // (sharded_lookup.h).
  const at::Tensor& sharded() const { return sharded_; }
  // While sharded: whether a tensor besides this FSDPParam still refers to the freed unsharded
  // storage (a view autograd saved in forward, which backward would read).
  bool unsharded_storage_referenced() const { return unsharded_.storage().use_count() > 1; }
  // Unsharded by unshard_single_rank: the parameter is its own shard, no bytes of its own.
  bool aliases_shard() const { return aliases_shard_; }

  // Copies chunks [first_chunk, first_chunk + count) of a full tensor of this parameter's
  // shape (chunk r: the padded shard of rank r, chunked along the shard dim) into slot_2d, a
  // [count, padded_numel()] column range of a flat buffer, zero-padded: a gradient into its
  // reduce-scatter input (all W chunks), or parameter values into a post-forward piece (hpZ).
  void copy_chunks_into(const at::Tensor& full, const at::Tensor& slot_2d,
                        int64_t first_chunk = 0) const;

  // Full gradient summed over backward passes that ran without gradient sync, in the reduce
  // dtype; reduce-scattered (and cleared) by the next backward that syncs.
  at::Tensor unsynced_grad;
  // Sharded gradient saved while the full gradient of the current backward accumulates.
  at::Tensor stashed_grad;
  // A sharded gradient already reduced over every data-parallel rank and divided as the unit's
  // own reduction divides (a lookup from shards' backward: sharded_lookup.h), in the master
  // dtype, waiting for the unit's own reduction of this step to be assigned; added to it then.
  at::Tensor reduced_addend;

 private:
  std::string name_;
  at::Tensor param_;
  std::vector<int64_t> global_shape_;
  DimShardLayout layout_;
  at::Tensor sharded_;
  at::Tensor unsharded_;
  bool unsharded_now_ = false;
  bool aliases_shard_ = false;  // unsharded through unshard_single_rank
};

}  // namespace fsdp::detail
