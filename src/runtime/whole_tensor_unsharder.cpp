// The whole-tensor placement's unshard (inter-tensor ZeRO-3): one broadcast per owner of the
// unit's tensors; see unsharder.h. Its reduces are GradientReducer's.
//
// Invariants:
// - Each parameter's layout is whole on its owner (chunk_rows = dim_size) and empty elsewhere, so
//   the unit's flat shards are exactly this rank's owned tensors in registration order: the
//   source of this rank's broadcast and the layout of its reduced gradients, with no copy in
//   either direction.
// - Every rank lists the same buckets (owners ascending, tensors in registration order) and
//   issues one broadcast per bucket in that order; the owner is the root of each.
// - An owned parameter aliases its shard while unsharded (unless the compute dtype differs) and
//   is not counted as unsharded bytes; a non-owned one is re-filled in place like Shard(0)'s.
// - The broadcasts are not on the stream schedule: the host waits for them before the copy-out.
#include "runtime/unsharder.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <utility>

namespace fsdp::detail {
namespace {

class WholeTensorUnsharder : public Unsharder {
 public:
  WholeTensorUnsharder(const UnsharderArgs& args, std::vector<OwnerBucket> buckets)
      : a_(args), buckets_(std::move(buckets)) {}

  // Issues the broadcasts of every bucket into pending (its buffer receives the buckets this
  // rank does not own, in bucket order).
  void issue(PendingGather& pending) override;
  const char* complete(PendingGather& pending) override;
  void drop(PendingGather& pending) override;
  void set_all_gather_hook(std::shared_ptr<AllGather> hook) override {
    TORCH_INTERNAL_ASSERT(hook == nullptr, "fsdp: unit '", a_.unit.label(),
                          "' broadcasts whole tensors: it has no all-gather to replace");
  }

 private:
  // Points each parameter at its full value: the owned ones at their shards (or a cast copy),
  // the others at the broadcast buffer's copy.
  void copy_out(const PendingGather& pending);

  UnsharderArgs a_;
  std::vector<OwnerBucket> buckets_;
};

void WholeTensorUnsharder::issue(PendingGather& pending) {
  const DeviceMesh& mesh = a_.unit.mesh();
  const int rank = mesh.shard_rank();
  const auto compute = a_.flat_shards.options().dtype(a_.compute_dtype);
  if (a_.compute_dtype != a_.flat_shards.scalar_type()) {
    SpanScope trace(a_.unit, "copy", "copy-in");
    pending.input = a_.flat_shards.to(a_.compute_dtype);
  }
  const at::Tensor& own = pending.input.defined() ? pending.input : a_.flat_shards;
  int64_t received = 0;
  for (const auto& bucket : buckets_) received += bucket.owner == rank ? 0 : bucket.numel;
  pending.buffer = at::empty({received}, compute);
  a_.unit.held(HeldKind::kCommBuffers, pending.buffer.nbytes());
  a_.unit.held(HeldKind::kUnshardedUnits, 1);
  pending.issued = RuntimeObserver::Clock::now();
  const CollectiveLabel collective_label(a_.unit.label());
  std::vector<WorkHandle> works;
  try {
    int64_t offset = 0;
    for (const auto& bucket : buckets_) {
      if (bucket.owner == rank) {
        TORCH_INTERNAL_ASSERT(own.numel() == bucket.numel);
        works.push_back(mesh.shard_group().broadcast(own, bucket.owner));
      } else {
        works.push_back(mesh.shard_group().broadcast(pending.buffer.narrow(0, offset, bucket.numel),
                                                     bucket.owner));
        offset += bucket.numel;
      }
    }
  } catch (const std::exception& e) {
    // Broadcasts already queued complete on the group's thread; their buffers stay alive in
    // their Works.
    uncount_gather(a_.unit, pending, /*gathered=*/false);
    a_.unit.rethrow_with_context("broadcast of parameters", e);
  }
  pending.work = std::make_shared<WorkList>(std::move(works));
}

const char* WholeTensorUnsharder::complete(PendingGather& pending) {
  try {
    a_.unit.wait_for(pending.work, "broadcast of parameters");
  } catch (...) {
    uncount_gather(a_.unit, pending, /*gathered=*/false);
    throw;
  }
  a_.unit.span("comm", "broadcast", pending.issued, pending.work->finished_at(),
               pending.buffer.nbytes(), "comm");
  copy_out(pending);
  uncount_gather(a_.unit, pending, /*gathered=*/true);
  return nullptr;
}

void WholeTensorUnsharder::copy_out(const PendingGather& pending) {
  SpanScope trace(a_.unit, "copy", "copy-out");
  const int rank = a_.unit.mesh().shard_rank();
  int64_t offset = 0;  // into the received buffer
  for (const auto& bucket : buckets_) {
    int64_t own_offset = 0;  // into this rank's shards (or their cast copy)
    for (const size_t i : bucket.params) {
      FSDPParam& p = a_.params[i];
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
      if (!p.aliases_shard()) a_.unit.held(HeldKind::kUnshardedParams, p.unsharded_bytes());
    }
  }
}

void WholeTensorUnsharder::drop(PendingGather& pending) {
  uncount_gather(a_.unit, pending, /*gathered=*/false);
  a_.unit.wait_for(pending.work, "broadcast of parameters");
}

}  // namespace

std::unique_ptr<Unsharder> make_whole_tensor_unsharder(const UnsharderArgs& args,
                                                       std::vector<OwnerBucket> buckets) {
  return std::make_unique<WholeTensorUnsharder>(args, std::move(buckets));
}

}  // namespace fsdp::detail
