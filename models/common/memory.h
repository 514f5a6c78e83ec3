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

// What fsdp::vocab_parallel_cross_entropy adds for `tokens` tokens over this rank's `columns` of
// the vocabulary (LossMemory's fields): it keeps the softmax of its columns (float32 at least)
// and per token the target's column (int64) and two masks; its forward holds the logits, their
// float32 copy if narrower and the shifted logits beside the softmax.
inline LossMemory vocab_parallel_loss_memory(int64_t tokens, int64_t columns,
                                             int64_t element_size) {
  const int64_t logits = tokens * columns * element_size;
  const int64_t wide = tokens * columns * (element_size < 4 ? 4 : element_size);
  return {wide + 10 * tokens, logits + (element_size < 4 ? wide : 0) + wide, 2 * wide};
}

// How the root is split by tensor parallelism over tp ranks (the families' root plans): its
// embedding table and head over the vocabulary (vocab_split) or whole, with or without sequence
// parallelism; activation_bytes: one [B, T, d] in the compute dtype; tokens: B * T;
// norm_gradient_bytes: the final norm's parameters' gradients (norm_parameters of them, each
// all-reduced on its own under sequence parallelism); position_bytes: a positional
// embedding's output [1, T, d], scattered beside the tokens' (GPT-2's wpe), or 0.
struct RootSplit {
  int tp = 1;
  bool sequence_parallel = false;
  bool vocab_split = false;
  int64_t activation_bytes = 0;
  int64_t tokens = 0;
  int64_t norm_gradient_bytes = 0;
  int64_t position_bytes = 0;
  int norm_parameters = 1;
};

// A family's root (ModelMemorySpec's root fields) for one rank under split: its parameters (the
// ones called vocabulary_names, [vocab, width], with dim 0 / tp under a vocabulary split), what
// it keeps before the first unit (saved_before) and after the last (saved_after, besides the
// loss's), the loss over this rank's columns of the vocabulary, a tied table's gradients, and
// what it moves over the tp group.
struct RootMemory {
  std::vector<std::string> vocabulary_names;
  bool tied = false;
  int64_t saved_before = 0;
  int64_t saved_after = 0;
};
ModelMemorySpec root_memory(const ParamTable& params, const RootSplit& split,
                            const RootMemory& root, int64_t element_size);

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
