// Memory-spec pieces every model shares (include/fsdp/memory_estimate.h): what the loss keeps and
// allocates, what fsdp::checkpoint keeps per checkpointed region, and the units of a model's
// identical layers.
#pragma once

#include <fsdp/memory_estimate.h>
#include <fsdp/tensor_parallel.h>
#include <models/common/param_table.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::models {

// CPU generator state that fsdp::checkpoint keeps per region (mt19937 plus normal-cache fields).
inline constexpr int64_t kCpuGeneratorStateBytes = 5056;

// What models::loss adds for `tokens` tokens over a vocabulary of `vocab`, the logits' elements
// of element_size bytes. The loss runs in float32 at least: narrower logits are copied to
// float32 first (a temporary), and the log-softmax, which autograd keeps for its backward, is
// float32 (or the logits' own wider dtype).
struct LossMemory {
  int64_t saved_bytes = 0;              // the log-softmax
  int64_t forward_workspace_bytes = 0;  // the logits, and their float32 copy if narrower
  // The gradients of the log-softmax's output and input; the logits' gradient in their own
  // dtype comes after the first of those is freed, and is no larger.
  int64_t backward_peak_bytes = 0;
};

inline LossMemory loss_memory(int64_t tokens, int64_t vocab, int64_t element_size) {
  const int64_t logits = tokens * vocab * element_size;
  const int64_t wide = tokens * vocab * (element_size < 4 ? 4 : element_size);
  return {wide, logits + (element_size < 4 ? wide : 0), 2 * wide};
}

// Under sequence parallelism, what the root moves over the tp group: the head's input gathered
// (head_input bytes) in forward; in backward the embeddings' shard gradients gathered
// (embedding_outputs bytes, whole) and the final norm's parameter gradients summed.
inline void set_sequence_parallel_root(ModelMemorySpec& spec, int64_t head_input,
                                       int64_t embedding_outputs, int64_t norm_gradients) {
  spec.root_tp_forward.all_gather = head_input;
  spec.root_tp_backward.all_gather = embedding_outputs;
  spec.root_tp_backward.all_reduce = norm_gradients;
}

// What one layer keeps and allocates, for one micro-batch (UnitMemorySpec's fields).
struct LayerMemory {
  int64_t saved_bytes = 0;
  int64_t forward_workspace_bytes = 0;
  int64_t backward_peak_bytes = 0;
};

// The same layer under fsdp::checkpoint: it keeps its input (input_bytes) and the generator
// state, its forward runs without autograd in no_grad_workspace_bytes, and its backward first
// recomputes plain's activations, then runs plain's backward on them.
inline LayerMemory checkpointed(const LayerMemory& plain, int64_t input_bytes,
                                int64_t no_grad_workspace_bytes) {
  return {input_bytes + kCpuGeneratorStateBytes, no_grad_workspace_bytes,
          plain.saved_bytes + plain.backward_peak_bytes};
}

// Tensor parallelism of every layer: the family's plan over tp ranks (paths relative to the
// layer), the bytes of one activation its layers move ([B, T, d] in the compute dtype, whole)
// and the compute dtype's element size. Without sequence parallelism a row layer all-reduces
// its partial output in forward, a column layer its input's gradient in backward, a
// ReplicateParallel module its parameters' gradients in backward. With it, a row layer
// reduce-scatters its output (its gradient gathered in backward, its whole bias's gradient
// summed), a gathered module all-gathers its input (and reduce-scatters the gradient of its
// column layers' input), norms sum their parameters' gradients. With activation checkpointing
// the recompute runs the forward's again.
struct LayerSplit {
  TensorParallelPlan plan;
  int tp = 1;
  int64_t activation_bytes = 0;
  bool recomputed = false;
  int64_t element_size = 4;
};

// What one layer moves over its tp group, forward and backward.
struct LayerTpBytes {
  TensorParallelBytes forward;
  TensorParallelBytes backward;
};
LayerTpBytes layer_tp_bytes(const ParamTable& params, const LayerSplit& split);

// The layer's parameter shapes as one rank holds them under split (parallelize_module's cuts: a
// column layer's weight and bias along dim 0, a row layer's weight along dim 1, its bias whole).
std::vector<std::vector<int64_t>> split_layer_shapes(const ParamTable& params,
                                                     const LayerSplit& split);

// One unit per layer of params ("<name_prefix><i>"), each with the table's layer shapes, or one
// rank's slices of them and its all-reduces under split.
std::vector<UnitMemorySpec> layer_units(const ParamTable& params, const std::string& name_prefix,
                                        const LayerMemory& layer, const LayerSplit& split = {});

}  // namespace fsdp::models
