// The whole-tensor placement of a unit (inter-tensor ZeRO-3): its broadcasts. The state machine
// around them is param_group.cpp's, unchanged; its reduces are GradientReducer's.
//
// Invariants:
// - Each parameter's layout is whole on its owner (chunk_rows = dim_size) and empty elsewhere, so
//   flat_shards_ is exactly this rank's owned tensors in registration order: the source of this
//   rank's broadcast and the layout of its reduced gradients, with no copy in either direction.
// - Every rank lists the same buckets (owners ascending, tensors in registration order) and
//   issues one broadcast per bucket in that order, and one reduce per bucket of trainable
//   tensors; the owner is the root of both.
// - An owned parameter aliases its shard while unsharded (unless the compute dtype differs) and
//   is not counted as unsharded bytes; a non-owned one is re-filled in place like Shard(0)'s.
// - A non-owned parameter's gradient is an empty tensor of its (empty) shard's shape: the sum
//   its rank contributed went to the owner, and what is left is dropped.
#include "runtime/param_group.h"

#include <fsdp/runtime/whole_tensor.h>
#include <fsdp/util/error.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace fsdp::detail {

void ParamGroup::issue_broadcasts(PendingGather& pending) {
  const int rank = mesh_.shard_rank();
  const auto compute = flat_shards_.options().dtype(compute_dtype_);
  if (compute_dtype_ != flat_shards_.scalar_type()) {
    TraceScope trace(mesh_.tracer(), "copy", "copy-in", label_);
    pending.input = flat_shards_.to(compute_dtype_);
  }
  const at::Tensor& own = pending.input.defined() ? pending.input : flat_shards_;
  int64_t received = 0;
  for (const auto& bucket : owner_buckets_) received += bucket.owner == rank ? 0 : bucket.numel;
  pending.buffer = at::empty({received}, compute);
  mesh_.stats().add_comm_buffers(pending.buffer.nbytes());
  mesh_.stats().add_unsharded_units(1);
  pending.issued = Tracer::Clock::now();
  const CollectiveLabel collective_label(label_);
  std::vector<WorkHandle> works;
  try {
    int64_t offset = 0;
    for (const auto& bucket : owner_buckets_) {
      if (bucket.owner == rank) {
        TORCH_INTERNAL_ASSERT(own.numel() == bucket.numel);
        works.push_back(mesh_.shard_group().broadcast(own, bucket.owner));
      } else {
        works.push_back(mesh_.shard_group().broadcast(
            pending.buffer.narrow(0, offset, bucket.numel), bucket.owner));
        offset += bucket.numel;
      }
    }
  } catch (const std::exception& e) {
    // Broadcasts already queued complete on the group's thread; their buffers stay alive in
    // their Works.
    uncount_gather(pending, /*gathered=*/false);
    unit_.rethrow_with_context("broadcast of parameters", e);
  }
  pending.work = std::make_shared<WorkList>(std::move(works));
}

void ParamGroup::copy_out_broadcasts(const PendingGather& pending) {
  TraceScope trace(mesh_.tracer(), "copy", "copy-out", label_);
  const int rank = mesh_.shard_rank();
  int64_t offset = 0;  // into the received buffer
  for (const auto& bucket : owner_buckets_) {
    int64_t own_offset = 0;  // into this rank's shards (or their cast copy)
    for (const size_t i : bucket.params) {
      FSDPParam& p = params_[i];
      const int64_t numel = p.layout().numel();
      if (bucket.owner != rank) {
        p.unshard_from_flat(pending.buffer.narrow(0, offset, numel));
        offset += numel;
      } else if (pending.input.defined()) {
        p.unshard_from_flat(pending.input.narrow(0, own_offset, numel));
        own_offset += numel;
      } else {
        p.unshard_single_rank();
      }
      if (!p.aliases_shard()) mesh_.stats().add_unsharded_params(p.unsharded_bytes());
    }
  }
}

}  // namespace fsdp::detail
