// The whole-tensor placement of a unit (inter-tensor ZeRO-3): its collectives. The state machine
// around them is param_group.cpp's, unchanged.
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

#include <map>

namespace fsdp::detail {
namespace {

// One Work for the broadcasts (or reduces) of a unit's buckets: waits for each in issue order.
// Its times are those of the last, which the backend runs last.
class WorkList : public Work {
 public:
  explicit WorkList(std::vector<WorkHandle> works) : works_(std::move(works)) {
    TORCH_INTERNAL_ASSERT(!works_.empty());
  }
  void wait() override {
    for (const auto& w : works_) w->wait();
    copy_times_from(*works_.back());
  }
  void wait_on_stream() override {
    for (const auto& w : works_) w->wait_on_stream();
  }
  bool is_completed() override {
    for (const auto& w : works_) {
      if (!w->is_completed()) return false;
    }
    copy_times_from(*works_.back());
    return true;
  }

 private:
  std::vector<WorkHandle> works_;
};

}  // namespace

void ParamGroup::build_owner_buckets() {
  std::map<int, OwnerBucket> by_owner;
  for (size_t i = 0; i < params_.size(); ++i) {
    const FSDPParam& p = params_[i];
    const int owner = options_.whole_tensor()->owner_of(p.param());
    OwnerBucket& bucket = by_owner[owner];
    bucket.owner = owner;
    bucket.params.push_back(i);
    bucket.numel += p.layout().numel();
  }
  for (auto& [owner, bucket] : by_owner) owner_buckets_.push_back(std::move(bucket));
}

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
    rethrow_with_context("broadcast of parameters", e);
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

PendingReduce ParamGroup::issue_owner_reduces(UnitGrads grads) {
  const int rank = mesh_.shard_rank();
  std::vector<int> owner_of_param(params_.size(), -1);
  for (const auto& bucket : owner_buckets_) {
    for (const size_t i : bucket.params) owner_of_param[i] = bucket.owner;
  }
  // The trainable tensors by owner, owners ascending (the same order on every rank).
  std::map<int, std::vector<size_t>> by_owner;  // owner -> positions in grads
  std::map<int, int64_t> numel_of;
  for (size_t k = 0; k < grads.params.size(); ++k) {
    const FSDPParam& p = *grads.params[k];
    const int owner = owner_of_param[static_cast<size_t>(&p - params_.data())];
    by_owner[owner].push_back(k);
    numel_of[owner] += p.layout().numel();
  }
  int64_t others = 0;
  for (const auto& [owner, numel] : numel_of) others += owner == rank ? 0 : numel;
  const auto reduce_options = flat_shards_.options().dtype(reduce_dtype_);
  PendingReduce reduce;
  reduce.unit = this;
  reduce.op = "reduce";
  reduce.input = at::empty({others}, reduce_options);
  reduce.output = at::empty({numel_of.count(rank) != 0 ? numel_of[rank] : 0}, reduce_options);
  {
    TraceScope trace(mesh_.tracer(), "copy", "copy-in", label_);
    int64_t offset = 0;  // into input: the buckets of the other owners, back to back
    for (const auto& [owner, positions] : by_owner) {
      const bool mine = owner == rank;
      const at::Tensor& dst = mine ? reduce.output : reduce.input;
      int64_t cursor = mine ? 0 : offset;
      for (const size_t k : positions) {
        const FSDPParam& p = *grads.params[k];
        const int64_t numel = p.layout().numel();
        const at::Tensor slot = dst.narrow(0, cursor, numel);
        if (grads.full[k].defined()) {
          slot.copy_(grads.full[k].reshape({numel}));
        } else {
          slot.zero_();  // an unused parameter contributes a zero gradient
        }
        grads.full[k] = at::Tensor();
        cursor += numel;
      }
      if (!mine) offset = cursor;
    }
  }
  mesh_.stats().add_comm_buffers(reduce.input.nbytes());
  reduce.params = std::move(grads.params);
  reduce.previous = std::move(grads.previous);
  // Summed to the owner, then divided (by W, or the unit's gradient divide factor).
  reduce.post_divide = gradient_divide_factor_.value_or(mesh_.shard_size());
  reduce.issued = Tracer::Clock::now();
  const CollectiveLabel collective_label(label_);
  std::vector<WorkHandle> works;
  try {
    int64_t offset = 0;
    for (const auto& [owner, numel] : numel_of) {
      if (owner == rank) {
        works.push_back(mesh_.shard_group().reduce(reduce.output, owner, ReduceOp::kSum));
      } else {
        works.push_back(mesh_.shard_group().reduce(reduce.input.narrow(0, offset, numel), owner,
                                                   ReduceOp::kSum));
        offset += numel;
      }
    }
  } catch (const std::exception& e) {
    mesh_.stats().add_comm_buffers(-reduce.input.nbytes());
    rethrow_with_context("reduce of gradients", e);
  }
  reduce.work = std::make_shared<WorkList>(std::move(works));
  return reduce;
}

}  // namespace fsdp::detail
