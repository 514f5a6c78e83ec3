// The memory estimator: replays one steady-state training step of one rank as a sequence of
// allocations and frees that mirrors what the runtime does (src/runtime/param_group.cpp), and
// keeps three running sums with their peaks: every live byte, the bytes RankStats counts as
// unsharded (parameters and gradients), and the communication buffers RankStats counts.
//
// The schedule replayed, per pass (grad_accum passes per step), per unit (the root first,
// then the units in forward order):
//   forward:  issue own gather (+ prefetch of the next units' gathers: buffers of S * shard
//             numel in the compute dtype, plus the cast copy of the shards under mixed
//             precision), wait = copy-out into the unsharded parameters (allocated while the
//             buffers are alive), free the buffer; compute (saved activations stay, a workspace
//             comes and goes); reshard after forward (blocks) or not
//             (shard_grad_op, the root, no-reshard accumulation).
//   backward: the root's head first (its full gradients appear), then units in reverse: gather
//             again if resharded, prefetch the previous unit, compute (a peak, then the saved
//             activations are gone and the full gradients made), post-backward: count
//             gradients + parameters (RankStats' peak point), reshard, then keep the full
//             gradients for a later pass (no sync) or copy them into the reduce-scatter input
//             and free them, at most kMaxReductionsInFlight reductions in flight (see
//             [Note: why reductions are capped at two in flight]); at the end the root's stem
//             (a tied embedding's second gradient summed with the head's, out of place), the
//             root's post-backward (its reduction's temporaries while the compute thread
//             waits) and (syncing) all reductions complete.
//   optimizer: gradients, parameters and state, plus AdamW's two temporaries of the largest
//             shard (sqrt(exp_avg_sq) and the denominator).
//   head_unit: the head's parameters are a unit after the blocks, gathered as the blocks
//             prefetch it, computing inside the root's head and kept gathered until its
//             backward (the first, which prefetches the last blocks); with a tied table the
//             stem looks its rows up from the head's shards (lookup_forward, lookup_backward).
// Collectives run on the process group's progress thread with temporaries of their own (see
// concurrent_temporaries). Parameters and optimizer state (from the previous step) are live
// throughout; zero_grad set the gradients to none before the first forward.
// The walk is shared: a StepObserver (step_replay.h) sees each of its events, which is how the
// step-time planner times the same schedule.
#include "estimate/step_replay.h"

#include <c10/util/Exception.h>
#include <fmt/format.h>
#include <fsdp/memory_estimate.h>
#include <fsdp/runtime/in_flight_limits.h>
#include <fsdp/runtime/whole_tensor.h>

#include <algorithm>
#include <deque>

namespace fsdp {
namespace {

int64_t element_size(at::ScalarType t) { return static_cast<int64_t>(c10::elementSize(t)); }

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// What the estimator needs of a unit's parameters on this rank.
struct UnitSizes {
  std::string name;
  int64_t shard_numel = 0;      // sum of padded local shards
  int64_t full_numel = 0;       // sum of full parameters
  int64_t max_shard_numel = 0;  // largest single padded shard (optimizer temporaries)
  int64_t saved = 0, forward_ws = 0, backward_peak = 0;
  TensorParallelBytes tp_forward, tp_backward;
  int64_t largest_received_numel = 0;  // whole_tensor: the largest bucket of another owner
};

// whole_tensor: the sizes on the rank that owns the most bytes (the lowest such rank), from the
// same partition the runtime makes: units 0 .. n-1 are the model's units, n the root.
std::vector<UnitSizes> whole_tensor_sizes(const ModelMemorySpec& model, int world,
                                          int64_t master_bytes, double evenness_priority) {
  std::vector<const std::vector<std::vector<int64_t>>*> shapes;
  for (const auto& u : model.units) shapes.push_back(&u.param_shapes);
  shapes.push_back(&model.root_param_shapes);
  std::vector<WholeTensorItem> items;
  for (size_t u = 0; u < shapes.size(); ++u) {
    for (const auto& shape : *shapes[u]) {
      items.push_back({"", numel_of(shape) * master_bytes, static_cast<int>(u)});
    }
  }
  const WholeTensorPartition partition = partition_whole_tensors(
      items, world, WholeTensorPartitionOptions().evenness_priority(evenness_priority));
  const int rank =
      static_cast<int>(std::max_element(partition.rank_bytes.begin(), partition.rank_bytes.end()) -
                       partition.rank_bytes.begin());
  std::vector<UnitSizes> sizes(shapes.size());
  std::vector<std::vector<int64_t>> bucket_numel(shapes.size(), std::vector<int64_t>(world, 0));
  for (size_t i = 0; i < items.size(); ++i) {
    UnitSizes& u = sizes[items[i].unit];
    const int64_t numel = items[i].bytes / master_bytes;
    u.full_numel += numel;
    bucket_numel[items[i].unit][partition.owners[i]] += numel;
    if (partition.owners[i] != rank) continue;
    u.shard_numel += numel;
    u.max_shard_numel = std::max(u.max_shard_numel, numel);
  }
  for (size_t u = 0; u < sizes.size(); ++u) {
    for (int r = 0; r < world; ++r) {
      if (r != rank) {
        sizes[u].largest_received_numel =
            std::max(sizes[u].largest_received_numel, bucket_numel[u][r]);
      }
    }
  }
  return sizes;
}

// shard_dim: Shard(shard_dim) for shapes with more than shard_dim dims, else Shard(0); either
// pads the sharded dim to ceil(size / shard) slices of the other dims' elements.
UnitSizes sizes_of(const std::string& name, const std::vector<std::vector<int64_t>>& shapes,
                   int shard, int64_t shard_dim) {
  UnitSizes u;
  u.name = name;
  for (const auto& shape : shapes) {
    const size_t d = static_cast<int64_t>(shape.size()) > shard_dim ? shard_dim : 0;
    const int64_t size = shape.empty() ? 1 : shape[d];
    const int64_t slice = shape.empty() ? 1 : numel_of(shape) / std::max<int64_t>(size, 1);
    const int64_t padded = padded_shard_rows(size, shard) * slice;
    u.shard_numel += padded;
    u.full_numel += numel_of(shape);
    u.max_shard_numel = std::max(u.max_shard_numel, padded);
  }
  return u;
}

// Running sums of one rank's bytes.
class Replay {
 public:
  void alloc(int64_t bytes, const std::string& phase) {
    live_ += bytes;
    if (live_ > peak_) {
      peak_ = live_;
      peak_phase_ = phase;
    }
    if (timeline_.empty() || timeline_.back().first != phase) timeline_.emplace_back(phase, live_);
    timeline_.back().second = std::max(timeline_.back().second, live_);
  }
  const std::vector<std::pair<std::string, int64_t>>& timeline() const { return timeline_; }
  void free(int64_t bytes) { live_ -= bytes; }
  void transient(int64_t bytes, const std::string& phase) {
    alloc(bytes, phase);
    free(bytes);
  }
  void count_unsharded(int64_t bytes) {
    unsharded_ += bytes;
    peak_unsharded_ = std::max(peak_unsharded_, unsharded_);
  }
  void count_comm(int64_t bytes) {
    comm_ += bytes;
    peak_comm_ = std::max(peak_comm_, comm_);
  }
  int64_t peak() const { return peak_; }
  const std::string& peak_phase() const { return peak_phase_; }
  int64_t peak_unsharded() const { return peak_unsharded_; }
  int64_t peak_comm() const { return peak_comm_; }

 private:
  int64_t live_ = 0, peak_ = 0;
  std::string peak_phase_;
  int64_t unsharded_ = 0, peak_unsharded_ = 0;
  int64_t comm_ = 0, peak_comm_ = 0;
  std::vector<std::pair<std::string, int64_t>> timeline_;
};

using detail::ComputePhase;
using detail::kRootUnit;
using detail::ReductionKind;

class StepModel {
 public:
  StepModel(const ModelMemorySpec& model, const MemoryEstimateOptions& o,
            detail::StepObserver& observer)
      : o_(o), obs_(observer) {
    TORCH_CHECK(o.world_size() >= 1, "estimate_memory: world_size must be at least 1, got ",
                o.world_size());
    TORCH_CHECK(o.grad_accum() >= 1, "estimate_memory: grad_accum must be at least 1, got ",
                o.grad_accum());
    TORCH_CHECK(o.prefetch() >= 0, "estimate_memory: prefetch must be non-negative, got ",
                o.prefetch());
    replicate_ = replicate_group_size(o);
    shard_ = o.world_size() / replicate_;
    set_dtype_sizes(o);
    set_resharding(o);
    set_unit_sizes(model, o);
  }

  MemoryEstimate run() {
    MemoryEstimate e;
    int64_t shard_numel = root_.shard_numel, max_shard = root_.max_shard_numel;
    for (const auto& u : units_) {
      shard_numel += u.shard_numel;
      max_shard = std::max(max_shard, u.max_shard_numel);
    }
    e.param_bytes = shard_numel * master_;
    e.grad_bytes = shard_numel * master_;
    e.optim_bytes = 2 * shard_numel * master_;
    e.activation_bytes = root_before_ + root_after_;
    for (const auto& u : units_) e.activation_bytes += u.saved;
    e.activation_bytes += lookup_saved_bytes();

    // Live throughout the step: the shards and AdamW's state. zero_grad left no gradients.
    r_.alloc(e.param_bytes + e.optim_bytes, "start of step");
    states_.assign(units_.size(), State{});
    root_state_ = State{};
    const int passes = o_.grad_accum();
    for (int k = 0; k < passes; ++k) {
      const bool last = k == passes - 1;
      const bool sync = last || o_.accumulation() == AccumulationMode::kSync ||
                        o_.accumulation() == AccumulationMode::kNoAllReduce;
      all_reduce_this_pass_ = last || o_.accumulation() != AccumulationMode::kNoAllReduce;
      const bool keep = o_.accumulation() == AccumulationMode::kNoReshard;
      forward(reshard_after_forward_ && !keep);
      backward(sync, !keep || last);
    }
    obs_.optimizer_step(shard_numel);
    r_.transient(2 * max_shard * master_, "optimizer step");

    e.peak_unsharded_bytes = r_.peak_unsharded();
    e.comm_buffer_bytes = r_.peak_comm();
    e.total_bytes = r_.peak();
    e.peak_phase = r_.peak_phase();
    e.all_gather_bytes = all_gather_bytes_;
    e.reduce_scatter_bytes = reduce_scatter_bytes_;
    e.all_reduce_bytes = all_reduce_bytes_;
    e.broadcast_bytes = broadcast_bytes_;
    e.reduce_bytes = reduce_bytes_;
    e.tensor_parallel = tensor_parallel_;
    e.timeline = r_.timeline();
    return e;
  }

 private:
  // How many ranks hold the same shard: the world under no_shard, the replica groups under HSDP.
  static int replicate_group_size(const MemoryEstimateOptions& o) {
    int replicate = 1;
    switch (o.strategy()) {
      case ShardingStrategy::kFullShard:
      case ShardingStrategy::kShardGradOp:
      case ShardingStrategy::kWholeTensor:
        break;
      case ShardingStrategy::kNoShard:
        replicate = o.world_size();
        break;
      case ShardingStrategy::kHybridShard:
        replicate = o.replicate();
        break;
    }
    TORCH_CHECK(replicate >= 1 && o.world_size() % replicate == 0, "estimate_memory: replicate ",
                replicate, " does not divide the world size ", o.world_size());
    if (!o.fsdp()) {
      TORCH_CHECK(o.world_size() == 1,
                  "estimate_memory: training without FSDP runs on one rank, got world_size ",
                  o.world_size());
      replicate = 1;
    }
    return replicate;
  }

  void set_dtype_sizes(const MemoryEstimateOptions& o) {
    master_ = element_size(o.master_dtype());
    compute_ =
        element_size(o.fsdp() ? o.param_dtype().value_or(o.master_dtype()) : o.master_dtype());
    const at::ScalarType reduce_dtype =
        o.fsdp() ? o.reduce_dtype().value_or(o.param_dtype().value_or(o.master_dtype()))
                 : o.master_dtype();
    reduce_ = element_size(reduce_dtype);
    widened_reduce_ = reduce_dtype == at::kBFloat16 || reduce_dtype == at::kHalf;
    cast_ = o.fsdp() && o.param_dtype().has_value() && *o.param_dtype() != o.master_dtype();
  }

  void set_resharding(const MemoryEstimateOptions& o) {
    // Blocks reshard after forward except under shard_grad_op (no_shard reshards too, as
    // fsdp-train sets it up: with one rank per shard group only a cast copy is freed).
    reshard_after_forward_ = o.strategy() != ShardingStrategy::kShardGradOp;
    const int size = o.reshard_after_forward_size();
    TORCH_CHECK(size >= 0 && (size == 0 || shard_ % size == 0),
                "estimate_memory: reshard_after_forward_size ", size,
                " does not divide the shard group of ", shard_, " ranks");
    TORCH_CHECK(size == 0 || size == shard_ || o.strategy() == ShardingStrategy::kFullShard ||
                    o.strategy() == ShardingStrategy::kHybridShard,
                "estimate_memory: reshard_after_forward_size applies to full_shard and "
                "hybrid_shard, not ",
                to_string(o.strategy()));
    if (size == 1) reshard_after_forward_ = false;
    if (size > 1 && size < shard_) post_forward_size_ = size;
    whole_tensor_ = o.fsdp() && o.strategy() == ShardingStrategy::kWholeTensor && shard_ > 1;
    TORCH_CHECK(
        !whole_tensor_ || post_forward_size_ == 0,
        "estimate_memory: whole_tensor broadcasts whole tensors; reshard_after_forward_size ", size,
        " (hpZ) does not apply to it");
  }

  void set_unit_sizes(const ModelMemorySpec& model, const MemoryEstimateOptions& o) {
    const auto whole = whole_tensor_
                           ? whole_tensor_sizes(model, shard_, master_, o.evenness_priority())
                           : std::vector<UnitSizes>{};
    std::vector<std::vector<int64_t>> root_shapes = model.root_param_shapes, head_shapes;
    if (o.head_unit()) split_head(model, o, root_shapes, head_shapes);
    root_ = whole_tensor_ ? whole.back() : sizes_of("root", root_shapes, shard_, o.shard_dim());
    root_.name = "root";
    for (size_t k = 0; k < model.units.size(); ++k) {
      const auto& u = model.units[k];
      UnitSizes s =
          whole_tensor_ ? whole[k] : sizes_of(u.name, u.param_shapes, shard_, o.shard_dim());
      s.name = u.name;
      s.saved = u.saved_bytes;
      s.forward_ws = u.forward_workspace_bytes;
      s.backward_peak = u.backward_peak_bytes;
      s.tp_forward = u.tp_forward;
      s.tp_backward = u.tp_backward;
      units_.push_back(s);
    }
    blocks_ = static_cast<int>(units_.size());
    if (o.head_unit()) units_.push_back(sizes_of("head", head_shapes, shard_, o.shard_dim()));
    root_before_ = model.root_saved_before_bytes;
    root_after_ = model.root_saved_after_bytes;
    root_forward_ws_ = model.root_forward_workspace_bytes;
    root_backward_peak_ = model.root_backward_peak_bytes;
    root_stem_backward_peak_ = model.root_stem_backward_peak_bytes;
    root_tp_forward_ = model.root_tp_forward;
    root_tp_backward_ = model.root_tp_backward;
  }

  // head_unit: the head's parameters (model.head.params) move from root_shapes to head_shapes.
  // The settings fsdp-train refuses with --head-unit are refused here too.
  void split_head(const ModelMemorySpec& model, const MemoryEstimateOptions& o,
                  std::vector<std::vector<int64_t>>& root_shapes,
                  std::vector<std::vector<int64_t>>& head_shapes) {
    const HeadUnitSpec& head = model.head;
    TORCH_CHECK(!head.params.empty(),
                "estimate_memory: head_unit, but the model describes no output head "
                "(ModelMemorySpec::head)");
    TORCH_CHECK(o.fsdp(),
                "estimate_memory: head_unit makes the head an FSDP unit; training "
                "without FSDP has no units");
    TORCH_CHECK(o.strategy() != ShardingStrategy::kWholeTensor,
                "estimate_memory: head_unit shards the head over Shard(0) shards; --strategy "
                "whole_tensor places whole tensors");
    TORCH_CHECK(o.shard_dim() == 0,
                "estimate_memory: head_unit looks a tied table up by rows "
                "(its dim 0); shard_dim ",
                o.shard_dim(), " is not supported with it");
    std::vector<bool> is_head(root_shapes.size(), false);
    for (size_t index : head.params) {
      TORCH_CHECK(index < root_shapes.size() && !is_head[index],
                  "estimate_memory: the head's parameter index ", index, " is outside the root's ",
                  root_shapes.size(), " parameters or repeated");
      is_head[index] = true;
      head_shapes.push_back(root_shapes[index]);
    }
    std::vector<std::vector<int64_t>> rest;
    for (size_t k = 0; k < root_shapes.size(); ++k) {
      if (!is_head[k]) rest.push_back(root_shapes[k]);
    }
    root_shapes = std::move(rest);
    lookup_tokens_ = head.lookup_tokens;
    lookup_width_ = head.lookup_width;
  }

  bool has_head() const { return static_cast<int>(units_.size()) > blocks_; }
  int head_index() const { return blocks_; }
  bool looks_up() const { return has_head() && lookup_tokens_ > 0; }

  // Unit state during the replay.
  struct State {
    bool unsharded = false;
    bool gathering = false;
    bool sharded_grad = false;  // holds a (sharded) gradient from an earlier pass of the step
    bool unsynced = false;      // holds full gradients of passes that did not sync
    bool piece = false;         // holds its hpZ piece (from forward to backward's gather)
  };

  bool gathers() const { return o_.fsdp() && (shard_ > 1 || cast_); }
  // whole_tensor: this rank's own tensors alias their shards unless cast.
  int64_t unsharded_bytes(const UnitSizes& u) const {
    if (whole_tensor_ && !cast_) return (u.full_numel - u.shard_numel) * compute_;
    return gathers() ? u.full_numel * compute_ : 0;
  }
  // whole_tensor: the buffer receives the other owners' buckets.
  int64_t gather_buffer_bytes(const UnitSizes& u) const {
    if (whole_tensor_) return (u.full_numel - u.shard_numel) * compute_;
    return u.shard_numel * shard_ * compute_;
  }
  int64_t cast_copy_bytes(const UnitSizes& u) const { return cast_ ? u.shard_numel * compute_ : 0; }
  // hpZ: the shard_ / post_forward_size_ padded shards a block keeps after forward.
  int64_t piece_bytes(const UnitSizes& u) const {
    return post_forward_size_ > 0 ? u.shard_numel * (shard_ / post_forward_size_) * compute_ : 0;
  }

  UnitSizes& unit(int i) { return i < 0 ? root_ : units_[i]; }
  State& state(int i) { return i < 0 ? root_state_ : states_[i]; }
  std::string label(int i) { return i < 0 ? std::string("root") : units_[i].name; }

  void issue(int i) {
    State& s = state(i);
    if (s.unsharded || s.gathering || !gathers()) return;
    const UnitSizes& u = unit(i);
    // From a piece: the piece is the all-gather's input (already in the compute dtype).
    const int64_t input = s.piece ? 0 : cast_copy_bytes(u);
    r_.alloc(input + gather_buffer_bytes(u), "all-gather of " + label(i));
    r_.count_comm(gather_buffer_bytes(u));
    if (whole_tensor_) {
      broadcast_bytes_ += u.full_numel * compute_;  // every bucket, the own one included
    } else {
      all_gather_bytes_ += gather_buffer_bytes(u);
    }
    // The all-gather writes straight into the gather buffer (the gloo backend's ring, NCCL's).
    // A gather from an hpZ piece runs on the post-forward group's own thread.
    issued_since_compute_.push_back(
        {gather_buffer_bytes(u), s.piece ? kPostForwardGroup : kShardGroup});
    obs_.issue_gather(i, gather_buffer_bytes(u), s.piece ? post_forward_size_ : shard_, s.piece,
                      input);
    s.gathering = true;
  }

  void wait(int i, const std::string& phase) {
    State& s = state(i);
    if (s.unsharded) return;
    issue(i);
    const UnitSizes& u = unit(i);
    if (s.gathering) {
      // Copy-out into the unsharded storages while the buffers are alive, then free them.
      obs_.wait_gather(i, unsharded_bytes(u));
      r_.alloc(unsharded_bytes(u), phase);
      r_.count_unsharded(unsharded_bytes(u));
      const int64_t input = s.piece ? piece_bytes(u) : cast_copy_bytes(u);
      r_.free(input + gather_buffer_bytes(u));
      r_.count_comm(-gather_buffer_bytes(u));
      if (s.piece) r_.count_unsharded(-piece_bytes(u));
      s.piece = false;
    }
    s.gathering = false;
    s.unsharded = true;
  }

  // The tp group's collectives of a module's pass: blocking, on the compute thread.
  void count_tensor_parallel(const TensorParallelBytes& bytes) {
    all_gather_bytes_ += bytes.all_gather.bytes;
    reduce_scatter_bytes_ += bytes.reduce_scatter.bytes;
    all_reduce_bytes_ += bytes.all_reduce.bytes;
    tensor_parallel_ += bytes;
    obs_.tensor_parallel(bytes);
  }

  void reshard(int i) {
    State& s = state(i);
    if (!s.unsharded) return;
    r_.free(unsharded_bytes(unit(i)));
    r_.count_unsharded(-unsharded_bytes(unit(i)));
    s.unsharded = false;
  }

  void forward(bool reshard_after_forward) {
    const int n = static_cast<int>(units_.size());
    // Root: gather, prefetch the first units (order of the previous step), compute the stem.
    issue(-1);
    for (int k = 0; k < o_.prefetch() && k < n; ++k) issue(k);
    wait(-1, "forward of root");
    if (looks_up()) lookup_forward("forward of root");
    obs_.compute(kRootUnit, ComputePhase::kRootStem);
    count_tensor_parallel(root_tp_forward_);
    r_.alloc(root_before_, "forward of root");
    r_.transient(concurrent_temporaries(), "forward of root");
    for (int i = 0; i < blocks_; ++i) {
      const std::string phase = "forward of " + units_[i].name;
      issue(i);
      for (int k = 1; k <= o_.prefetch() && i + k < n; ++k) issue(i + k);
      wait(i, phase);
      obs_.compute(i, ComputePhase::kForward);
      count_tensor_parallel(units_[i].tp_forward);
      r_.alloc(units_[i].saved, phase);
      r_.transient(units_[i].forward_ws + concurrent_temporaries(), phase);
      if (reshard_after_forward && post_forward_size_ > 0) {
        // hpZ: the piece is copied out of the full parameters, which are then freed.
        r_.alloc(piece_bytes(units_[i]), phase);
        r_.count_unsharded(piece_bytes(units_[i]));
        reshard(i);
        state(i).piece = true;
      } else if (reshard_after_forward) {
        reshard(i);
      }
    }
    // The head's unit computes inside the root's head (final norm, head, loss) and stays
    // gathered for its backward, the first.
    if (has_head()) wait(head_index(), "forward of head");
    obs_.compute(kRootUnit, ComputePhase::kRootHead);
    r_.alloc(root_after_, "end of forward");
    r_.transient(root_forward_ws_, "end of forward");
  }

  // A unit's pre-backward: its own gather (if resharded) and the prefetch of the units before it.
  void issue_backward_gathers(int i) {
    issue(i);
    for (int k = 1; k <= o_.prefetch() && i - k >= 0; ++k) {
      if (!state(i - k).unsharded) issue(i - k);
    }
  }

  void backward(bool sync, bool reshard_after_backward) {
    // The root's head: the output's and loss's gradients, then the root's full gradients (the
    // tied embedding's among them unless the head is a unit), alive until the root's
    // post-backward at the end. The head's unit, gathered since its forward, prefetches the
    // last blocks when the loss's gradient reaches it (after that gradient's peak, before the
    // head's own backward, most of this compute) and reduces its gradients right after it.
    r_.transient(root_backward_peak_ + concurrent_temporaries(), "backward of root (head)");
    r_.free(root_after_);
    r_.alloc(root_.full_numel * compute_, "backward of root (head)");
    if (has_head()) issue_backward_gathers(head_index());
    obs_.compute(kRootUnit, ComputePhase::kRootHeadBackward);
    if (has_head()) {
      r_.alloc(units_[head_index()].full_numel * compute_, "backward of head");
      post_backward(head_index(), sync, reshard_after_backward, "backward of head");
    }
    for (int i = blocks_ - 1; i >= 0; --i) {
      const std::string phase = "backward of " + units_[i].name;
      issue_backward_gathers(i);
      wait(i, phase);
      obs_.compute(i, ComputePhase::kBackward);
      count_tensor_parallel(units_[i].tp_backward);
      r_.transient(units_[i].backward_peak + concurrent_temporaries(), phase);
      // Its end state: the saved activations gone, the full gradients made.
      r_.free(units_[i].saved);
      r_.alloc(units_[i].full_numel * compute_, phase);
      post_backward(i, sync, reshard_after_backward, phase);
    }
    // The root's stem (embeddings) last: its transient (a tied embedding's second gradient
    // and the sum of both, or the lookup's gathered gradients) while the first unit's
    // reduction, just issued, runs beside it.
    obs_.compute(kRootUnit, ComputePhase::kRootStemBackward);
    count_tensor_parallel(root_tp_backward_);
    const int64_t stem_peak = looks_up() ? lookup_backward() : root_stem_backward_peak_;
    r_.transient(stem_peak + concurrent_temporaries(), "backward of root (stem)");
    r_.free(root_before_ + lookup_saved_bytes());
    post_backward(kRootUnit, sync, reshard_after_backward, "end of backward");
    // No compute follows the root's post-backward: its reduction's temporaries are alive while
    // the compute thread waits for the reductions still in flight.
    r_.transient(concurrent_temporaries(), "end of backward");
    if (sync) {
      while (!pending_.empty()) finish_oldest();
      while (!all_reducing_.empty()) finish_oldest_all_reduce();
    }
  }

  // ---- The lookup from shards ([Note: a lookup from shards]) ----

  // The shard group's ids ([S, n] int64), kept from the lookup to its backward.
  int64_t lookup_saved_bytes() const { return looks_up() ? shard_ * lookup_tokens_ * 8 : 0; }

  detail::LookupCollectives lookup_collectives() const {
    detail::LookupCollectives c;
    c.shard_group = shard_;
    c.replicas = replicate_;
    return c;
  }
  void add_call(detail::LookupCollectives& c, detail::LookupCollectives::Group group,
                const char* name, int64_t bytes) {
    c.calls.push_back({group, name, bytes});
    (std::string(name) == "all_gather" ? all_gather_bytes_ : reduce_scatter_bytes_) += bytes;
  }

  // Forward: every rank's count and range check ([S, 2] int64), then (S > 1) the ids and the
  // reduce-scatter of the partial rows, [S, n, width] in the compute dtype, into this rank's.
  void lookup_forward(const std::string& phase) {
    using Group = detail::LookupCollectives::Group;
    const int64_t rows = shard_ * lookup_tokens_ * lookup_width_ * compute_;
    detail::LookupCollectives c = lookup_collectives();
    add_call(c, Group::kShard, "all_gather", shard_ * 2 * 8);
    if (shard_ > 1) {
      add_call(c, Group::kShard, "all_gather", shard_ * lookup_tokens_ * 8);
      add_call(c, Group::kShard, "reduce_scatter", rows);
    }
    c.compute_bytes = rows;
    obs_.lookup(c);
    r_.alloc(lookup_saved_bytes(), phase);
    // The partial rows and the reduced ones alive at once.
    r_.transient(rows + (shard_ > 1 ? lookup_tokens_ * lookup_width_ * compute_ : 0), phase);
  }

  // Backward: the rows' gradients all-gathered over the shard group and then (HSDP) across
  // replicas with the ids, so that every rank sums every token's gradient into the rows it
  // holds. Returns the transient: the gathered gradients, this rank's share of them (about 1/S)
  // in the master dtype and its rows of the table's gradient (the head's largest shard).
  int64_t lookup_backward() {
    using Group = detail::LookupCollectives::Group;
    const int64_t gathered = replicate_ * shard_ * lookup_tokens_ * lookup_width_ * compute_;
    detail::LookupCollectives c = lookup_collectives();
    if (shard_ > 1) {
      add_call(c, Group::kShard, "all_gather", shard_ * lookup_tokens_ * lookup_width_ * compute_);
    }
    if (replicate_ > 1) {
      add_call(c, Group::kReplicate, "all_gather", replicate_ * 8);
      add_call(c, Group::kReplicate, "all_gather", replicate_ * shard_ * lookup_tokens_ * 8);
      add_call(c, Group::kReplicate, "all_gather", gathered);
    }
    c.compute_bytes = gathered;
    obs_.lookup(c);
    return gathered + replicate_ * lookup_tokens_ * lookup_width_ * master_ +
           units_[head_index()].max_shard_numel * master_;
  }

  // ParamGroup::post_backward: the unit's full gradients (already allocated) are counted with
  // its parameters, the parameters resharded, then the gradients are kept for a later backward
  // (no sync), or packed for the reduction and freed.
  void post_backward(int i, bool sync, bool reshard_after_backward, const std::string& phase) {
    UnitSizes& u = unit(i);
    State& s = state(i);
    const int64_t grads = u.full_numel * compute_;
    if (o_.fsdp()) r_.count_unsharded(grads);
    if (reshard_after_backward) reshard(i);
    if (o_.fsdp()) r_.count_unsharded(-grads);
    if (!o_.fsdp()) {
      // Plain LibTorch: AccumulateGrad adds into the gradient of an earlier pass in place.
      if (s.sharded_grad) r_.free(grads);
      s.sharded_grad = true;
      return;
    }
    // Gradients of earlier passes that did not sync, summed in place with this one's.
    int64_t full = grads;
    if (s.unsynced) {
      r_.count_unsharded(-u.full_numel * reduce_);
      r_.free(grads);
      full = u.full_numel * reduce_;
      s.unsynced = false;
    }
    if (!sync) {
      obs_.keep_gradients(i, full);
      keep_unsynced(u, s, full, grads, phase);
    } else if (shard_ == 1 && replicate_ == 1) {
      obs_.keep_gradients(i, full);
      keep_single_rank(u, s, full, phase);
    } else {
      issue_reduction(i, u, full, phase);
    }
  }

  // No sync: the full gradients (`full` bytes) are kept, in the reduce dtype, for the backward
  // that syncs.
  void keep_unsynced(const UnitSizes& u, State& s, int64_t full, int64_t grads,
                     const std::string& phase) {
    if (full == grads && reduce_ != compute_) {
      r_.alloc(u.full_numel * reduce_, phase);
      r_.free(grads);
    }
    r_.count_unsharded(u.full_numel * reduce_);
    s.unsynced = true;
  }

  // One rank: the full gradient is the sharded one (re-typed to the master dtype if needed),
  // plus the one of an earlier pass, which it replaces.
  void keep_single_rank(const UnitSizes& u, State& s, int64_t full, const std::string& phase) {
    if (compute_ != master_ || reduce_ != master_) {
      r_.alloc(u.shard_numel * master_, phase);
      r_.free(full);
    }
    if (s.sharded_grad) r_.free(u.shard_numel * master_);
    s.sharded_grad = true;
  }

  // Packs unit i's full gradients (`full` bytes, freed) into the reduction's input and issues
  // the reduction, keeping at most kMaxReductionsInFlight in flight (see
  // [Note: why reductions are capped at two in flight]).
  void issue_reduction(int i, const UnitSizes& u, int64_t full, const std::string& phase) {
    if (whole_tensor_) {
      issue_owner_reductions(i, u, full, phase);
      return;
    }
    const int64_t input = u.shard_numel * shard_ * reduce_;
    r_.alloc(input, phase);
    r_.count_comm(input);
    r_.free(full);
    const int64_t output = shard_ == 1 ? 0 : u.shard_numel * reduce_;  // no_shard: in place
    r_.alloc(output, phase);
    pending_.push_back({input, output, u.shard_numel, i});
    obs_.issue_reduction(i, full, input,
                         shard_ == 1 ? ReductionKind::kAllReduce : ReductionKind::kReduceScatter,
                         shard_ == 1 ? replicate_ : shard_);
    // The reduce-scatter's input, then (HSDP) the reduced shard across replicas; with one rank
    // per shard group (DDP), the all-reduce of the packed gradients in place.
    if (shard_ > 1) reduce_scatter_bytes_ += input;
    if (replicate_ > 1 && all_reduce_this_pass_) all_reduce_bytes_ += shard_ == 1 ? input : output;
    if (shard_ > 1) issued_since_compute_.push_back({ring_temporaries(u), kShardGroup});
    finish_beyond_cap();
  }

  // As RootState::add_reduce: the oldest reductions complete once more than
  // kMaxReductionsInFlight are issued (see [Note: why reductions are capped at two in flight]).
  void finish_beyond_cap() {
    while (pending_.size() > static_cast<size_t>(kMaxReductionsInFlight)) finish_oldest();
  }

  // whole_tensor: the other owners' buckets are packed into the input, this rank's own into the
  // output, and each is reduced to its owner; gloo's reduce copies a non-root's tensor first.
  void issue_owner_reductions(int i, const UnitSizes& u, int64_t full, const std::string& phase) {
    const int64_t input = (u.full_numel - u.shard_numel) * reduce_;
    const int64_t output = u.shard_numel * reduce_;
    r_.alloc(input + output, phase);
    r_.count_comm(input);
    r_.free(full);
    pending_.push_back({input, output, u.shard_numel, i});
    obs_.issue_reduction(i, full, input + output, ReductionKind::kReduceScatter, shard_);
    reduce_bytes_ += u.full_numel * reduce_;
    issued_since_compute_.push_back({u.largest_received_numel * reduce_, kShardGroup});
    finish_beyond_cap();
  }

  // The ring reduce-scatter's (src/comm/gloo) temporaries: its running partial sum and receive
  // buffer, one output shard each; in bfloat16 and half each hop also adds in float32, so two
  // float32 copies of a shard (the received chunk and this rank's own) are alive beside them.
  // (An all-reduce's temporaries live inside gloo.)
  int64_t ring_temporaries(const UnitSizes& u) const {
    const int64_t widened = widened_reduce_ ? 2 * u.shard_numel * element_size(at::kFloat) : 0;
    return 2 * u.shard_numel * reduce_ + widened;
  }

  struct Pending {
    int64_t input, output, shard_numel;
    int unit;
  };

  // As RootState::finish_reduces: the oldest reduce-scatter completes; under HSDP its output's
  // all-reduce across replicas is issued and completes kMaxAllReducesInFlight later (see
  // [Note: HSDP's all-reduce runs beside the next units' backward]).
  void finish_oldest() {
    const Pending p = pending_.front();
    pending_.pop_front();
    const bool all_reduce_after = shard_ > 1 && replicate_ > 1 && all_reduce_this_pass_;
    obs_.finish_reduction(p.unit, shard_ == 1 ? p.input : p.output,
                          all_reduce_after ? replicate_ : 1);
    r_.count_comm(-p.input);
    if (shard_ > 1) r_.free(p.input);
    if (!all_reduce_after) {
      assign_reduced(p);
      return;
    }
    all_reducing_.push_back(p);
    while (all_reducing_.size() > static_cast<size_t>(kMaxAllReducesInFlight)) {
      finish_oldest_all_reduce();
    }
  }

  void finish_oldest_all_reduce() {
    const Pending p = all_reducing_.front();
    all_reducing_.pop_front();
    obs_.finish_all_reduce(p.unit, p.output);
    assign_reduced(p);
  }

  // The reduced shard becomes the gradient (in the master dtype); an earlier pass's sharded
  // gradient is added to it and freed.
  void assign_reduced(const Pending& p) {
    const int64_t reduced = shard_ == 1 ? p.input : p.output;
    if (reduce_ != master_) {
      r_.alloc(p.shard_numel * master_, "gradient reduction");
      r_.free(reduced);
    }
    State& s = state(p.unit);
    if (s.sharded_grad) r_.free(p.shard_numel * master_);
    s.sharded_grad = true;
  }

  // Collectives run one at a time on each process group's progress thread, with temporaries of
  // their own. Those issued since the previous unit began computing (the next unit's
  // prefetched all-gather, the previous unit's reduce-scatter) typically run while this unit
  // computes; the largest of their temporaries per group is counted at its compute peak (the
  // groups' threads run at the same time: under hpZ a gather from pieces beside a
  // reduce-scatter). Earlier ones had a whole unit's compute to finish.
  enum Group { kShardGroup, kPostForwardGroup };
  struct Issued {
    int64_t bytes;
    Group group;
  };
  int64_t concurrent_temporaries() {
    int64_t most[2] = {0, 0};
    for (const Issued& op : issued_since_compute_) {
      most[op.group] = std::max(most[op.group], op.bytes);
    }
    issued_since_compute_.clear();
    return most[kShardGroup] + most[kPostForwardGroup];
  }
  std::vector<Issued> issued_since_compute_;

  MemoryEstimateOptions o_;
  detail::StepObserver& obs_;
  int shard_ = 1, replicate_ = 1;
  int64_t master_ = 4, compute_ = 4, reduce_ = 4;
  bool cast_ = false;
  bool widened_reduce_ = false;  // reductions in bfloat16 or half add in float32
  bool reshard_after_forward_ = true;
  int post_forward_size_ = 0;  // hpZ group size, when 1 < N < shard_
  bool whole_tensor_ = false;  // inter-tensor ZeRO-3 over shard_ > 1 ranks
  int64_t all_gather_bytes_ = 0, reduce_scatter_bytes_ = 0, all_reduce_bytes_ = 0;
  TensorParallelBytes tensor_parallel_;
  bool all_reduce_this_pass_ = true;  // kNoAllReduce: only the step's last backward all-reduces
  int64_t broadcast_bytes_ = 0, reduce_bytes_ = 0;
  UnitSizes root_;
  std::vector<UnitSizes> units_;  // the blocks (blocks_ of them), then the head under head_unit
  int blocks_ = 0;
  int64_t lookup_tokens_ = 0, lookup_width_ = 0;  // head_unit over a tied table
  int64_t root_before_ = 0, root_after_ = 0, root_forward_ws_ = 0, root_backward_peak_ = 0,
          root_stem_backward_peak_ = 0;
  TensorParallelBytes root_tp_forward_, root_tp_backward_;
  State root_state_;
  std::vector<State> states_;
  std::deque<Pending> pending_;
  std::deque<Pending> all_reducing_;  // HSDP: reduced shards being all-reduced across replicas
  Replay r_;
};

}  // namespace

int64_t padded_shard_rows(int64_t dim0, int shard_size) {
  TORCH_CHECK(shard_size >= 1, "shard size must be at least 1, got ", shard_size);
  return (dim0 + shard_size - 1) / shard_size;
}

std::string MemoryEstimate::to_json() const {
  return fmt::format(
      "{{\"param_bytes\": {}, \"grad_bytes\": {}, \"optim_bytes\": {}, \"peak_unsharded_bytes\": "
      "{}, "
      "\"activation_bytes\": {}, \"comm_buffer_bytes\": {}, \"total_bytes\": {}, \"peak_phase\": "
      "\"{}\", \"all_gather_bytes\": {}, \"reduce_scatter_bytes\": {}, \"all_reduce_bytes\": {}, "
      "\"broadcast_bytes\": {}, \"reduce_bytes\": {}}}",
      param_bytes, grad_bytes, optim_bytes, peak_unsharded_bytes, activation_bytes,
      comm_buffer_bytes, total_bytes, peak_phase, all_gather_bytes, reduce_scatter_bytes,
      all_reduce_bytes, broadcast_bytes, reduce_bytes);
}

namespace detail {

MemoryEstimate replay_step(const ModelMemorySpec& model, const MemoryEstimateOptions& options,
                           StepObserver* observer) {
  StepObserver none;
  return StepModel(model, options, observer != nullptr ? *observer : none).run();
}

}  // namespace detail

MemoryEstimate estimate_memory(const ModelMemorySpec& model, const MemoryEstimateOptions& options) {
  return detail::replay_step(model, options, nullptr);
}

}  // namespace fsdp
