// Memory estimator: predicts, before training, the bytes one rank holds during an FSDP training
// step, by category, from the model's parameter shapes and activation sizes.
//
// The categories are the ones the runtime and fsdp-train report (--metrics), with the same
// definitions, so a prediction can be checked against a run:
//   param_bytes          the rank's sharded parameters, padding included (each rank holds
//                        ceil(dim0 / S) rows of every parameter, S = the shard group's size)
//   grad_bytes           their gradients after backward, same layout, master dtype
//   optim_bytes          AdamW's exp_avg and exp_avg_sq, same layout, master dtype
//   peak_unsharded_bytes RankStats' peak of unsharded parameters + unsharded gradients alive at
//                        once (gathered parameters in the compute dtype; the full gradients of
//                        a unit at the end of its backward)
//   activation_bytes     what autograd keeps for backward at the end of forward (one pass's
//                        micro-batch when a step accumulates several)
//   comm_buffer_bytes    peak of all-gather / reduce-scatter staging buffers
//   total_bytes          peak of all live tensor bytes over a steady-state step (optimizer
//                        state present): the categories above are not all at their peaks at
//                        the same moment, so the estimator replays the runtime's schedule
//                        (gathers, prefetch, reshards, reduce-scatters two in flight, the
//                        release of activations unit by unit in backward, the temporaries of
//                        the collective running beside each unit's compute, the optimizer
//                        step) and takes the largest sum. fsdp-train measures it as
//                        peak_alloc_bytes; RSS adds the process's own ~0.4 GB and malloc's
//                        retained pages.
// Measured against fsdp-train (bench/training_modes.sh, tests/estimate/): every category but
// the total is exact; the total is within a few percent, the spread of which collective
// happens to overlap the peak.
// Strategies (FSDP1's names, as fsdp-train --strategy sets them up): full_shard (S = W, blocks
// reshard after forward), shard_grad_op (S = W, nothing reshards after forward), no_shard
// (S = 1, replicated as in DDP), hybrid_shard (S = W / R within each of R replicas). The root
// unit never reshards after forward, nor does the head's unit under head_unit. With
// reshard_after_forward_size N (hpZ) a block keeps S / N of its shards from its forward to its
// backward. Implicit prefetch and AdamW are assumed; buffers gloo allocates inside its algorithms
// (not tensors) are not counted.
#pragma once

#include <fsdp/sharding_strategy.h>

#include <c10/core/ScalarType.h>
#include <torch/arg.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fsdp {

// One kind of collective over a tensor-parallel group in one pass: the bytes it moves, counted
// as the process groups count a payload (an all-gather's output, a reduce-scatter's input, an
// all-reduce's tensor), and how many calls carry them (the step-time planner prices each call's
// latency).
struct TensorParallelTraffic {
  int64_t bytes = 0;
  int64_t calls = 0;
  // more_bytes carried by more_calls calls (one per parameter, say; one by default).
  void add(int64_t more_bytes, int64_t more_calls = 1) {
    bytes += more_bytes;
    calls += more_calls;
  }
  TensorParallelTraffic& operator+=(const TensorParallelTraffic& other) {
    add(other.bytes, other.calls);
    return *this;
  }
};

// What a module moves over its tensor-parallel group in one pass, by collective.
struct TensorParallelBytes {
  TensorParallelTraffic all_gather;
  TensorParallelTraffic reduce_scatter;
  TensorParallelTraffic all_reduce;
  TensorParallelBytes& operator+=(const TensorParallelBytes& other) {
    all_gather += other.all_gather;
    reduce_scatter += other.reduce_scatter;
    all_reduce += other.all_reduce;
    return *this;
  }
};

// One FSDP unit as the estimator sees it. Byte counts are for one rank's micro-batch, in the
// compute dtype; the model describes them (see models/gpt2/gpt2_memory.h).
struct UnitMemorySpec {
  std::string name;
  // Shapes of the unit's trainable parameters (a tied parameter once, in its owning unit).
  std::vector<std::vector<int64_t>> param_shapes;
  // Bytes autograd keeps from the unit's forward until its backward.
  int64_t saved_bytes = 0;
  // Most bytes alive at once during the unit's forward beyond what is alive when it returns.
  int64_t forward_workspace_bytes = 0;
  // Most bytes alive at once during the unit's backward beyond what was alive when it began:
  // activation gradients, the parameter gradients made so far and, with activation
  // checkpointing, the recomputed activations, less the saved tensors released so far. (When
  // the backward ends, saved_bytes are gone and the full parameter gradients are alive.)
  int64_t backward_peak_bytes = 0;
  // Tensor parallelism: what the unit moves over its tp group in its forward (a row layer's
  // partial outputs; under sequence parallelism also the gathered inputs) and in its backward (a
  // column layer's input gradients, whole parameters' gradients, and the recomputed forward's
  // under activation checkpointing).
  TensorParallelBytes tp_forward;
  TensorParallelBytes tp_backward;
};

// The output head as the estimator sees it when it is an FSDP unit of its own
// (MemoryEstimateOptions::head_unit, fsdp-train --head-unit; see [Note: the head as a unit] in
// tools/fsdp_train/parallelize.cpp).
struct HeadUnitSpec {
  // The head's parameters among the root's (indices into ModelMemorySpec::root_param_shapes):
  // with head_unit they leave the root for the head's unit, the last in forward order, which
  // keeps them gathered from its forward to its backward. A tied table is one of them.
  std::vector<size_t> params;
  // A tied table: the stem's embedding then reads the rows it needs from the head's shards
  // (fsdp::embedding, [Note: a lookup from shards] in src/runtime/sharded_lookup.cpp):
  // lookup_tokens ids per micro-batch, rows of lookup_width elements. 0 when the embedding has a
  // table of its own (untied), which stays the root's.
  int64_t lookup_tokens = 0;
  int64_t lookup_width = 0;
};

// A model: the root unit's own parameters and activations, and the units called from its
// forward, in forward order.
struct ModelMemorySpec {
  std::vector<std::vector<int64_t>> root_param_shapes;
  // Root activations kept from before the first unit runs (released last in backward) and
  // after the last (released first).
  int64_t root_saved_before_bytes = 0;
  int64_t root_saved_after_bytes = 0;
  // The forward's output and loss temporaries alive at the end of forward beyond what is saved.
  int64_t root_forward_workspace_bytes = 0;
  // Most bytes alive at once during the root's part of backward before the units' (the
  // gradients of the loss and of the output) beyond what was alive when backward began.
  int64_t root_backward_peak_bytes = 0;
  // Most bytes alive at once during the root's part of backward after the units' (the
  // embeddings' backward, last) beyond what was alive when it began. The estimator counts all
  // of the root's parameter gradients from the head's backward on, so this is what comes and
  // goes: e.g. a tied embedding's dense gradient and its sum with the head's gradient.
  int64_t root_stem_backward_peak_bytes = 0;
  // Tensor parallelism: what the root's own modules move over the tp group (under sequence
  // parallelism: the embeddings' scatter, the final norm's gradients, the head's gather).
  TensorParallelBytes root_tp_forward;
  TensorParallelBytes root_tp_backward;
  std::vector<UnitMemorySpec> units;
  // Which of the root's parameters form the output head; empty params: the model has no head
  // that can be a unit, and head_unit is refused.
  HeadUnitSpec head;
};

struct MemoryEstimateOptions {
  // Ranks FSDP runs over. Under tensor parallelism over T ranks, the data-parallel ones (the
  // job's W / T), with the model's spec of one rank's slices (ModelSpec::memory_spec's tp).
  // (optional) defaults to 1.
  TORCH_ARG(int, world_size) = 1;
  TORCH_ARG(ShardingStrategy, strategy) = ShardingStrategy::kFullShard;
  // Replicas for hybrid_shard (must divide world_size). (optional) defaults to 1.
  TORCH_ARG(int, replicate) = 1;
  // dtype of the sharded parameters, gradients and optimizer state. (optional) defaults to fp32.
  TORCH_ARG(at::ScalarType, master_dtype) = at::kFloat;
  // Mixed precision, as in MixedPrecisionPolicy. (optional) default to the master dtype.
  TORCH_ARG(std::optional<at::ScalarType>, param_dtype) = std::nullopt;
  TORCH_ARG(std::optional<at::ScalarType>, reduce_dtype) = std::nullopt;
  // The blocks' reshard_after_forward as an int N (hpZ, full_shard and hybrid_shard): after
  // forward each keeps W/N of its S padded shards until its backward gathers within groups of
  // N. 0 (or S) is the strategy's own choice; must divide S. (optional) defaults to 0.
  TORCH_ARG(int, reshard_after_forward_size) = 0;
  // Implicit prefetch depth (units). (optional) defaults to 1.
  TORCH_ARG(int, prefetch) = 1;
  // Forward/backward passes per optimizer step; the model spec describes one pass's
  // micro-batch. (optional) defaults to 1.
  TORCH_ARG(int, grad_accum) = 1;
  TORCH_ARG(AccumulationMode, accumulation) = AccumulationMode::kSync;
  // whole_tensor: the partition's evenness priority (WholeTensorPartitionOptions). (optional)
  // defaults to 1.
  TORCH_ARG(double, evenness_priority) = 1.0;
  // Shard(shard_dim) for every parameter with more than shard_dim dims (fsdp-train --shard-dim,
  // FullyShardOptions::shard_placement_fn): its shard is padded along that dim instead of dim 0.
  // (optional) defaults to 0.
  TORCH_ARG(int64_t, shard_dim) = 0;
  // false: plain single-process training, no FSDP (fsdp-train --no-fsdp). (optional) defaults
  // to true.
  TORCH_ARG(bool, fsdp) = true;
  // The output head as a unit of its own (ModelMemorySpec::head; fsdp-train --head-unit): its
  // gather prefetched beside the blocks' forward, kept to its backward, its reduction issued
  // right after it; a tied table looked up from the head's shards, whose collectives run on the
  // mesh's side groups and are waited for at once. (optional) defaults to false.
  TORCH_ARG(bool, head_unit) = false;
};

struct MemoryEstimate {
  int64_t param_bytes = 0;
  int64_t grad_bytes = 0;
  int64_t optim_bytes = 0;
  int64_t peak_unsharded_bytes = 0;
  int64_t activation_bytes = 0;
  int64_t comm_buffer_bytes = 0;
  int64_t total_bytes = 0;
  // Communication of one step, as the runtime counts it (CollectiveCounters' payload: an
  // all-gather's output, a reduce-scatter's input, an all-reduce's tensor): the gathers of
  // parameters, the gradient reductions and the all-reduces across replicas. Scalars outside
  // the FSDP runtime (the gradient norm, the trainer's loss) are not counted.
  int64_t all_gather_bytes = 0;
  int64_t reduce_scatter_bytes = 0;
  int64_t all_reduce_bytes = 0;
  // whole_tensor: the broadcasts of parameters (every owner's bucket, this rank's own included)
  // and the reduces of gradients to their owners.
  int64_t broadcast_bytes = 0;
  int64_t reduce_bytes = 0;
  // Tensor parallelism: the part of the bytes above that moves over the tp group, and the calls
  // that carry it (the runtime's tp group counts the same, plus clipping's one all-reduce).
  TensorParallelBytes tensor_parallel;
  // Where the step's peak is ("backward of h.7", "optimizer step", ...).
  std::string peak_phase;
  // The most bytes live in each phase of the replayed step, in order.
  std::vector<std::pair<std::string, int64_t>> timeline;
  // JSON object with the fields above, under their names.
  std::string to_json() const;
};

// Predicts one rank's bytes. Throws on a bad configuration (world size not divisible by the
// replicas, a non-positive size), naming the values.
MemoryEstimate estimate_memory(const ModelMemorySpec& model, const MemoryEstimateOptions& options);

// Rows a rank holds of a parameter with dim0 rows over a shard group of shard_size ranks,
// padding included: ceil(dim0 / shard_size); a 0-D parameter counts as one row.
int64_t padded_shard_rows(int64_t dim0, int shard_size);

}  // namespace fsdp
