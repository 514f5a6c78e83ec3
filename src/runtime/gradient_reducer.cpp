// A unit's gradient reduction; see gradient_reducer.h for what it owns, and
// gradient_reduction.h for the divide rules it applies.
//
// Gradient flow of one unit in backward: autograd accumulates full gradients into the
// (unsharded) parameters; post-backward takes them off (take_grads), copies them into one flat
// [W, S] buffer on compute (pack_input: the full gradients die as soon as they are copied,
// FSDP2's order), reduce-scatters it (and, HSDP, all-reduces the [S] output across replicas),
// scales it by the divide rules and hands each parameter a sharded gradient that is a view of
// the [S] output (finish). A sharded gradient left from an earlier backward (accumulation
// without zero_grad) was stashed in pre-backward, because AccumulateGrad would otherwise try to
// add a full gradient to it, and is added back when the reduction finishes.
//
// Invariants: every byte of a packed input, a partial sum and a kept unsynced gradient is
// reported to the rank's stats as it is allocated and freed. Every rank issues the same
// collectives in the same order: the choice between them depends only on settings every rank
// shares and on the unit's parameters, never on whether a rank's gradients happen to exist.
#include "runtime/gradient_reducer.h"

#include "runtime/custom_collectives.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/strides.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

namespace fsdp::detail {
namespace {

// A tensor over [offset, offset + numel(shape)) of flat's storage that is not an autograd
// view of flat: optimizers detach_() gradients in zero_grad, which views do not allow.
at::Tensor alias_of(const at::Tensor& flat, int64_t offset, c10::IntArrayRef shape) {
  at::NoGradGuard no_grad;
  at::Tensor alias = at::empty({0}, flat.options());
  alias.set_(flat.storage(), flat.storage_offset() + offset, shape, c10::contiguous_strides(shape));
  return alias;
}

// Adds the gradient a lookup from shards reduced for p (if any) into grad, the sharded gradient
// being assigned to p, and clears it. See [Note: a lookup's gradient joins the unit's].
void add_reduced_addend(FSDPParam& p, at::Tensor& grad) {
  if (!p.reduced_addend.defined()) return;
  at::Tensor addend = std::move(p.reduced_addend);
  p.reduced_addend = at::Tensor();
  if (!grad.defined()) {
    grad = addend.to(p.sharded().options());
    return;
  }
  grad.add_(addend.to(grad.options()));
}

}  // namespace

GradientReducer::GradientReducer(const UnitContext& unit, std::vector<FSDPParam>& params,
                                 const at::Tensor& flat_shards, at::ScalarType reduce_dtype,
                                 bool offload_to_host, std::vector<OwnerBucket> owner_buckets)
    : unit_(unit),
      params_(params),
      flat_shards_(flat_shards),
      reduce_dtype_(reduce_dtype),
      offload_to_host_(offload_to_host),
      owner_buckets_(std::move(owner_buckets)) {}

void GradientReducer::set_gradient_divide_factor(double factor) {
  TORCH_CHECK(std::isfinite(factor) && factor > 0, "fsdp: set_gradient_divide_factor(", factor,
              ") on unit '", unit_.label(),
              "': the factor divides the summed gradients and must be finite and > 0");
  gradient_divide_factor_ = factor;
}

GradientReduction GradientReducer::plan() const {
  const DeviceMesh& mesh = unit_.mesh();
  return plan_gradient_reduction(mesh.shard_size(), mesh.replicate_size(), reduce_dtype_,
                                 gradient_divide_factor_, force_sum_reduction_);
}

bool GradientReducer::reduces_gradients() const {
  const bool trainable = std::any_of(params_.begin(), params_.end(),
                                     [](const FSDPParam& p) { return p.requires_grad(); });
  const DeviceMesh& mesh = unit_.mesh();
  return trainable && requires_gradient_sync_ &&
         (mesh.shard_size() > 1 || mesh.replicate_group() != nullptr);
}

// ---- Accumulation ----

void GradientReducer::stash_sharded_grads() {
  for (auto& p : params_) {
    if (!p.requires_grad()) continue;
    p.stashed_grad = p.param().grad();
    p.param().mutable_grad() = at::Tensor();
  }
}

UnitGrads GradientReducer::take_grads(bool backward_ran) {
  UnitGrads grads;
  for (auto& p : params_) {
    if (!p.requires_grad()) continue;
    at::Tensor grad = p.param().grad();
    at::Tensor before = std::move(p.stashed_grad);
    if (!backward_ran) {
      // Pre-backward never ran, so this unit got no gradient this backward: whatever
      // gradient the parameter holds is a sharded one from before.
      before = std::move(grad);
      grad = at::Tensor();
    }
    p.stashed_grad = at::Tensor();
    p.param().mutable_grad() = at::Tensor();
    if (grad.defined()) grads.full_bytes += grad.nbytes();
    grads.params.push_back(&p);
    grads.full.push_back(std::move(grad));
    grads.previous.push_back(std::move(before));
    grads.reduce_numel += p.padded_numel();
  }
  return grads;
}

double GradientReducer::divide_factor() const {
  const DeviceMesh& mesh = unit_.mesh();
  return gradient_divide_factor_.value_or(static_cast<double>(mesh.shard_size()) *
                                          static_cast<double>(mesh.replicate_size()));
}

// [Note: a lookup's gradient joins the unit's]
// A lookup from shards (sharded_lookup.h) reduces its table's gradient itself, in its own
// backward, which may come before or after the backward of the unit that owns the table. Its
// result waits on the parameter (FSDPParam::reduced_addend) until the unit next assigns sharded
// gradients (the finish of a reduction, or one rank's assignment), so that it joins the same
// step's gradient whatever is in flight or kept unsynced then; only when the unit has nothing
// in flight, keeps nothing and has no backward still to come is it added to the sharded
// gradient at once.
void GradientReducer::add_reduced_gradient(FSDPParam& p, at::Tensor addend, bool backward_done) {
  if (p.reduced_addend.defined()) {
    p.reduced_addend.add_(addend);
  } else {
    p.reduced_addend = std::move(addend);
  }
  if (backward_done && reductions_in_flight_ == 0 && !holds_bytes()) {
    at::Tensor grad = p.param().grad();
    add_reduced_addend(p, grad);
    p.param().mutable_grad() = grad;
  }
}

std::optional<PendingReduce> GradientReducer::reduce(UnitGrads grads) {
  const DeviceMesh& mesh = unit_.mesh();
  add_unsynced_grads(grads);
  if (!requires_gradient_sync_) {
    keep_unsynced_grads(grads);
  } else if (mesh.shard_size() == 1 && mesh.replicate_group() == nullptr) {
    assign_single_rank_grads(grads);
  } else if (mesh.shard_size() == 1 && !requires_all_reduce_) {
    keep_local_partial(grads);
  } else if (!owner_buckets_.empty()) {
    ++reductions_in_flight_;
    return issue_owner_reduces(std::move(grads));
  } else {
    ++reductions_in_flight_;
    return issue_reduce(std::move(grads));
  }
  return std::nullopt;
}

bool GradientReducer::holds_bytes() const {
  if (partial_reduce_output_.defined()) return true;
  for (const FSDPParam& p : params_) {
    if (p.unsynced_grad.defined()) return true;
  }
  return false;
}

void GradientReducer::add_unsynced_grads(UnitGrads& grads) {
  // Gradients of earlier backward passes that did not sync are added first, so the sum is
  // formed in the same order as autograd's accumulation in a single process.
  for (size_t i = 0; i < grads.params.size(); ++i) {
    FSDPParam& p = *grads.params[i];
    if (!p.unsynced_grad.defined()) continue;
    unit_.held(HeldKind::kUnshardedGrads, -p.unsynced_grad.nbytes());
    if (grads.full[i].defined()) p.unsynced_grad.add_(grads.full[i]);
    grads.full[i] = std::move(p.unsynced_grad);
    p.unsynced_grad = at::Tensor();
  }
}

void GradientReducer::keep_unsynced_grads(UnitGrads& grads) {
  // No reduction this time: keep the full gradients (in the reduce dtype) for the backward
  // that syncs, and give the parameters back the sharded gradients they had.
  for (size_t i = 0; i < grads.params.size(); ++i) {
    FSDPParam& p = *grads.params[i];
    if (grads.full[i].defined()) {
      p.unsynced_grad = grads.full[i].to(reduce_dtype_).contiguous();
      unit_.held(HeldKind::kUnshardedGrads, p.unsynced_grad.nbytes());
    }
    p.param().mutable_grad() = grads.previous[i];
  }
}

void GradientReducer::assign_single_rank_grads(UnitGrads& grads) {
  // One rank: the full gradient is the sharded gradient; nothing to copy or reduce. (Rounding
  // through the reduce dtype is kept, as a one-rank reduction in it would do.)
  // A divide factor or hook applies as to a one-rank reduction: the hook sees the unit's
  // gradients packed into one flat tensor.
  const at::ScalarType master_dtype = flat_shards_.scalar_type();
  const GradientReduction reduction = plan();
  for (auto& full : grads.full) {
    if (!full.defined()) continue;
    full = full.to(reduce_dtype_);
    if (reduction.pre_scale != 1.0) full = full.mul(reduction.pre_scale);
  }
  if (all_reduce_hook_) {
    std::vector<at::Tensor> flat;
    for (size_t i = 0; i < grads.params.size(); ++i) {
      flat.push_back(grads.full[i].defined() ? grads.full[i].reshape({-1})
                                             : at::zeros({grads.params[i]->padded_numel()},
                                                         unit_.device_options(reduce_dtype_)));
    }
    at::Tensor packed = at::cat(flat);
    run_all_reduce_hook(packed);
    int64_t offset = 0;
    for (size_t i = 0; i < grads.params.size(); ++i) {
      const int64_t numel = grads.params[i]->padded_numel();
      grads.full[i] = packed.narrow(0, offset, numel);
      offset += numel;
    }
  }
  for (size_t i = 0; i < grads.params.size(); ++i) {
    FSDPParam& p = *grads.params[i];
    const auto shape = p.layout().padded_shape(p.global_shape());
    at::Tensor full;
    if (grads.full[i].defined()) {
      full = grads.full[i];
      if (reduction.post_divide != 1.0) full = full.div(reduction.post_divide);
      full = full.to(master_dtype);
      if (offload_to_host_) full = full.to(at::kCPU);
    }
    at::Tensor grad = full.defined() ? alias_of(full.contiguous(), 0, shape)
                                     : at::zeros(shape, flat_shards_.options());
    if (grads.previous[i].defined()) grad.add_(grads.previous[i]);
    add_reduced_addend(p, grad);
    p.param().mutable_grad() = grad;
  }
}

void GradientReducer::keep_local_partial(UnitGrads& grads) {
  // Replicas only and no all-reduce: nothing to communicate; the packed gradients join the
  // partial sum (FSDP2 copies them to the reduce output and keeps that).
  PendingReduce local;
  StreamEvent packed;
  local.input = pack_input(grads, packed);
  const double pre_scale = plan().pre_scale;
  if (pre_scale != 1.0) local.input.mul_(pre_scale);
  local.params = std::move(grads.params);
  local.previous = std::move(grads.previous);
  keep_partial_reduce(local.input, local);
}

// ---- Issuing ----

at::Tensor GradientReducer::pack_input(UnitGrads& grads, StreamEvent& packed) {
  // On compute, where autograd wrote the full gradients, so they are freed as soon as copied
  // (FSDP2's order); the reduce-scatter stream waits on `packed`.
  DeviceStreams::Op op(unit_.streams(), ScheduleStream::kCompute, ScheduleOpKind::kRsCopyIn,
                       unit_.label());
  op.reads("grad").writes("rs_in").frees("grad");
  const int world = unit_.mesh().shard_size();
  at::Tensor input = allocate_reduce_buffer(reduce_scatter_hook_.get(), world * grads.reduce_numel,
                                            unit_.device_options(reduce_dtype_), unit_.label());
  SpanScope trace(unit_, "copy", "copy-in");
  const at::Tensor input_2d = input.view({world, grads.reduce_numel});
  int64_t column = 0;
  for (size_t i = 0; i < grads.params.size(); ++i) {
    FSDPParam& p = *grads.params[i];
    const at::Tensor slot = input_2d.narrow(1, column, p.padded_numel());
    if (grads.full[i].defined()) {
      p.copy_chunks_into(grads.full[i], slot);
    } else {
      slot.zero_();  // an unused parameter contributes a zero gradient
    }
    grads.full[i] = at::Tensor();
    column += p.padded_numel();
  }
  packed = op.record("rs_copied_in");
  return input;
}

PendingReduce GradientReducer::issue_reduce(UnitGrads grads) {
  const DeviceMesh& mesh = unit_.mesh();
  const bool replicas = mesh.replicate_group() != nullptr;
  PendingReduce reduce;
  reduce.reducer = this;
  reduce.input = pack_input(grads, reduce.packed);
  reduce.params = std::move(grads.params);
  reduce.previous = std::move(grads.previous);
  const GradientReduction reduction = plan();
  reduce.keep_partial = replicas && !requires_all_reduce_;
  reduce.replicate_after = replicas && mesh.shard_size() > 1 && requires_all_reduce_;
  reduce.all_reduce_op = reduction.all_reduce_op;
  reduce.post_divide = reduction.post_divide;
  unit_.held(HeldKind::kCommBuffers, reduce.input.nbytes());
  reduce.issued = RuntimeObserver::Clock::now();
  const CollectiveLabel collective_label(unit_.label());
  unit_.streams().flush(ScheduleStream::kReduceScatter);
  try {
    if (mesh.shard_size() == 1) {
      issue_all_reduce_in_place(reduce, reduction);
    } else {
      issue_reduce_scatter(reduce, reduction, grads.reduce_numel);
    }
  } catch (const std::exception& e) {
    unit_.held(HeldKind::kCommBuffers, -reduce.input.nbytes());
    unit_.rethrow_with_context("reduce-scatter of gradients", e);
  }
  return reduce;
}

void GradientReducer::issue_all_reduce_in_place(PendingReduce& reduce,
                                                const GradientReduction& reduction) {
  // No shard dimension (DDP-style replication): the packed gradients are all-reduced across
  // replicas in place.
  DeviceStreams::Op op(unit_.streams(), ScheduleStream::kAllReduce, ScheduleOpKind::kAllReduce,
                       unit_.label());
  op.wait(reduce.packed).reads("rs_in").writes("rs_in");
  reduce.output = reduce.input;
  if (reduction.pre_scale != 1.0) reduce.output.mul_(reduction.pre_scale);
  add_partial_sum(reduce.output);
  reduce.op = "all-reduce";
  reduce.work = unit_.mesh().replicate_group()->all_reduce(reduce.output, reduction.all_reduce_op);
  unit_.order_stream_after(reduce.work);
  reduce.reduced = op.record("reduced");
}

void GradientReducer::issue_reduce_scatter(PendingReduce& reduce,
                                           const GradientReduction& reduction,
                                           int64_t reduce_numel) {
  DeviceStreams::Op op(unit_.streams(), ScheduleStream::kReduceScatter,
                       ScheduleOpKind::kReduceScatter, unit_.label());
  op.wait(reduce.packed).reads("rs_in").writes("rs_out");
  reduce.output = allocate_reduce_buffer(reduce_scatter_hook_.get(), reduce_numel,
                                         unit_.device_options(reduce_dtype_), unit_.label());
  if (reduction.pre_scale != 1.0) reduce.input.mul_(reduction.pre_scale);
  reduce.work =
      start_reduce_scatter(reduce_scatter_hook_.get(), unit_.mesh().shard_group(), reduce.output,
                           reduce.input, reduction.reduce_scatter_op, unit_.label());
  unit_.order_stream_after(reduce.work);
  reduce.reduced = op.record("reduced");
}

std::map<int, int64_t> GradientReducer::pack_by_owner(UnitGrads& grads, PendingReduce& reduce) {
  // Each parameter's owner is its whole tensor's rank; the trainable tensors are packed by
  // owner, owners ascending (the same order on every rank).
  const DeviceMesh& mesh = unit_.mesh();
  const int rank = mesh.shard_rank();
  std::vector<int> owner_of_param(params_.size(), -1);
  for (const auto& bucket : owner_buckets_) {
    for (const size_t i : bucket.params) owner_of_param[i] = bucket.owner;
  }
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
  reduce.input = at::empty({others}, reduce_options);
  reduce.output = at::empty({numel_of.count(rank) != 0 ? numel_of[rank] : 0}, reduce_options);
  SpanScope trace(unit_, "copy", "copy-in");
  int64_t offset = 0;  // into input: the buckets of the other owners, back to back
  for (const auto& [owner, positions] : by_owner) {
    const bool mine = owner == rank;
    const at::Tensor& dst = mine ? reduce.output : reduce.input;
    int64_t cursor = mine ? 0 : offset;
    for (const size_t k : positions) {
      const int64_t numel = grads.params[k]->layout().numel();
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
  return numel_of;
}

PendingReduce GradientReducer::issue_owner_reduces(UnitGrads grads) {
  // The output is this rank's own bucket, which becomes its owned parameters' gradients. A
  // non-owned parameter's gradient is an empty tensor of its (empty) shard's shape: the sum its
  // rank contributed went to the owner, and what is left is dropped.
  const DeviceMesh& mesh = unit_.mesh();
  const int rank = mesh.shard_rank();
  PendingReduce reduce;
  reduce.reducer = this;
  reduce.op = "reduce";
  const std::map<int, int64_t> numel_of = pack_by_owner(grads, reduce);
  unit_.held(HeldKind::kCommBuffers, reduce.input.nbytes());
  reduce.params = std::move(grads.params);
  reduce.previous = std::move(grads.previous);
  // Summed to the owner, then divided (by W, or the unit's gradient divide factor).
  reduce.post_divide = gradient_divide_factor_.value_or(mesh.shard_size());
  reduce.issued = RuntimeObserver::Clock::now();
  const CollectiveLabel collective_label(unit_.label());
  std::vector<WorkHandle> works;
  try {
    int64_t offset = 0;
    for (const auto& [owner, numel] : numel_of) {
      if (owner == rank) {
        works.push_back(mesh.shard_group().reduce(reduce.output, owner, ReduceOp::kSum));
      } else {
        works.push_back(mesh.shard_group().reduce(reduce.input.narrow(0, offset, numel), owner,
                                                  ReduceOp::kSum));
        offset += numel;
      }
    }
  } catch (const std::exception& e) {
    unit_.held(HeldKind::kCommBuffers, -reduce.input.nbytes());
    unit_.rethrow_with_context("reduce of gradients", e);
  }
  reduce.work = std::make_shared<WorkList>(std::move(works));
  return reduce;
}

// ---- Finishing ----

void GradientReducer::finish(PendingReduce& reduce) {
  TORCH_INTERNAL_ASSERT(reduce.reducer == this, "fsdp: unit '", unit_.label(),
                        "' asked to finish another unit's reduction");
  if (reduce.replicate_after) {
    TORCH_INTERNAL_ASSERT(reduce.across != nullptr, "fsdp: unit '", unit_.label(),
                          "' asked to finish a reduction whose all-reduce was not started");
    // In program order the host waits here; with streams compute waits on all_reduced below.
    if (unit_.streams().in_program_order()) {
      unit_.wait_for(reduce.across, "all-reduce of gradients across replicas");
    }
    unit_.span("comm", "all-reduce", reduce.across_issued, reduce.across->finished_at(),
               reduce.output.nbytes(), "comm");
    assign_and_release(reduce, reduce.all_reduced);
    return;
  }
  complete_collective(reduce);
  if (reduce.keep_partial) {
    // On a device the host waits for the reduce-scatter before compute adds its output.
    if (!unit_.streams().in_program_order()) {
      unit_.wait_for(reduce.work, "reduction of gradients");
    }
    keep_partial_reduce(reduce.output, reduce);
    --reductions_in_flight_;
    return;
  }
  assign_and_release(reduce, reduce.reduced);
}

void GradientReducer::start_all_reduce(PendingReduce& reduce) {
  TORCH_INTERNAL_ASSERT(reduce.reducer == this && reduce.replicate_after && !reduce.across,
                        "fsdp: unit '", unit_.label(),
                        "' asked to start an all-reduce twice, "
                        "or for a reduction that has none");
  complete_collective(reduce);
  issue_all_reduce_across_replicas(reduce);
}

void GradientReducer::complete_collective(PendingReduce& reduce) {
  DeviceStreams& streams = unit_.streams();
  // With streams, compute waits on the reduction's event instead of the host here.
  if (streams.in_program_order()) unit_.wait_for(reduce.work, "reduction of gradients");
  const int64_t input_bytes = reduce.input.nbytes();
  unit_.span("comm", reduce.op, reduce.issued, reduce.work->finished_at(), input_bytes, "comm");
  unit_.held(HeldKind::kCommBuffers, -input_bytes);
  // In program order the reduction has completed: free its input now, as ever. With streams the
  // input (allocated on compute) is freed once compute has waited on the reduction.
  if (streams.in_program_order()) reduce.input = at::Tensor();
}

void GradientReducer::assign_and_release(PendingReduce& reduce, const StreamEvent& ready) {
  const StreamEvent finished = assign_reduced(reduce, ready);
  --reductions_in_flight_;
  // The output (allocated on the reduce-scatter stream) may live on as the sharded gradients;
  // this drops the runtime's own reference, ordered after the finish (FSDP2 does the same).
  if (unit_.mesh().shard_size() > 1) {
    unit_.streams().release_after(ScheduleStream::kReduceScatter, std::move(reduce.output),
                                  finished, "rs_out", unit_.label());
  }
}

StreamEvent GradientReducer::assign_reduced(PendingReduce& reduce, const StreamEvent& ready) {
  const bool scattered = unit_.mesh().shard_size() > 1;
  DeviceStreams::Op op(unit_.streams(), ScheduleStream::kCompute, ScheduleOpKind::kFinishReduce,
                       unit_.label());
  op.wait(ready).reads(scattered ? "rs_out" : "rs_in").writes("sharded_grad").frees("rs_in");
  reduce.input = at::Tensor();
  // The hook sees the reduced (all-reduced) gradients on compute, after the wait on ready.
  if (all_reduce_hook_) run_all_reduce_hook(reduce.output);
  if (reduce.post_divide != 1.0) reduce.output.div_(reduce.post_divide);
  // Sharded gradients live in the master (sharded parameter) dtype, and with offload on the
  // host. The copy to the host overlaps unless a gradient is accumulated into on the host
  // (FSDP2's rule); end of backward waits for it.
  at::Tensor sharded = reduce.output.to(flat_shards_.scalar_type());
  if (offload_to_host_) {
    const bool accumulates = std::any_of(reduce.previous.begin(), reduce.previous.end(),
                                         [](const at::Tensor& t) { return t.defined(); });
    sharded = sharded.to(sharded.options().device(at::kCPU),
                         /*non_blocking=*/flat_shards_.is_pinned() && !accumulates);
  }
  assign_sharded_grads(sharded, reduce);
  return op.record("finished");
}

void GradientReducer::issue_all_reduce_across_replicas(PendingReduce& reduce) {
  // HSDP: this rank's reduced shard, summed over the replicas holding the same shard.
  reduce.across_issued = RuntimeObserver::Clock::now();
  const CollectiveLabel collective_label(unit_.label());
  DeviceStreams& streams = unit_.streams();
  DeviceStreams::Op op(streams, ScheduleStream::kAllReduce, ScheduleOpKind::kAllReduce,
                       unit_.label());
  op.wait(reduce.reduced).reads("rs_out").writes("rs_out");
  // set_requires_all_reduce: the sum of earlier backward passes' reduce-scattered gradients.
  add_partial_sum(reduce.output);
  reduce.across = unit_.mesh().replicate_group()->all_reduce(reduce.output, reduce.all_reduce_op);
  if (!streams.in_program_order()) {
    try {
      unit_.order_stream_after(reduce.across);
    } catch (const std::exception& e) {
      unit_.rethrow_with_context("all-reduce of gradients across replicas", e);
    }
  }
  reduce.all_reduced = op.record("all_reduced");
}

void GradientReducer::add_partial_sum(const at::Tensor& output) {
  if (!partial_reduce_output_.defined()) return;
  output.add_(partial_reduce_output_);
  unit_.held(HeldKind::kCommBuffers, -partial_reduce_output_.nbytes());
  partial_reduce_output_ = at::Tensor();
}

void GradientReducer::keep_partial_reduce(const at::Tensor& reduced, const PendingReduce& reduce) {
  if (partial_reduce_output_.defined()) {
    partial_reduce_output_.add_(reduced);
  } else {
    partial_reduce_output_ = reduced;  // a buffer of this reduction's own
    unit_.held(HeldKind::kCommBuffers, partial_reduce_output_.nbytes());
  }
  for (size_t i = 0; i < reduce.params.size(); ++i) {
    reduce.params[i]->param().mutable_grad() = reduce.previous[i];
  }
}

void GradientReducer::run_all_reduce_hook(at::Tensor& reduced) const {
  const auto sizes = reduced.sizes().vec();
  const auto dtype = reduced.scalar_type();
  const c10::Device device = unit_.mesh().device();
  all_reduce_hook_(reduced);
  TORCH_CHECK(reduced.defined() && reduced.sizes().vec() == sizes &&
                  reduced.scalar_type() == dtype && reduced.device() == device,
              "fsdp: the all-reduce hook of unit '", unit_.label(), "' must leave its tensor ",
              sizes, " ", dtype, " on ", device, " as it was (modify it in place), got ",
              reduced.defined()
                  ? c10::str(reduced.sizes(), " ", reduced.scalar_type(), " on ", reduced.device())
                  : std::string("an undefined tensor"));
}

void GradientReducer::assign_sharded_grads(const at::Tensor& reduced, const PendingReduce& reduce) {
  int64_t offset = 0;
  for (size_t i = 0; i < reduce.params.size(); ++i) {
    FSDPParam& p = *reduce.params[i];
    at::Tensor grad = alias_of(reduced, offset, p.layout().padded_shape(p.global_shape()));
    if (reduce.previous[i].defined()) grad.add_(reduce.previous[i]);
    add_reduced_addend(p, grad);
    p.param().mutable_grad() = grad;
    offset += p.padded_numel();
  }
}

}  // namespace fsdp::detail
