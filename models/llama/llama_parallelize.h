// How a Llama decoder layer is split by tensor parallelism (torchtitan's Llama plan): q/k/v and
// gate/up column-wise, o and down row-wise, so that attention runs on heads / T query heads and
// kv_heads / T key/value heads per rank and the MLP on intermediate_size / T features, with one
// all-reduce after attention and one after the MLP. Qwen3's per-head q/k norms (qk_norm) are
// ReplicateParallel: applied to this rank's heads, their weights' gradients summed.
//
// With sequence parallelism the activations between attention and the MLP, and between layers,
// are sequence shards: each all-reduce becomes a reduce-scatter after the row layer and an
// all-gather before the column layers; the norms (SequenceParallel) run on 1/T of the tokens.
// The root's plan then scatters the embeddings into shards, runs the final norm on them and
// gathers the sequence for the output projection.
//
// The root: when vocab_size divides by tp, the embedding table is split over the vocabulary
// (RowwiseParallel; each rank looks up its rows, the partial lookups summed) and so is the head
// (ColwiseParallel; logits split over the vocabulary, whose loss is computed without gathering
// them), so a rank holds 1/tp of them (torchtitan's plan, with loss parallelism). Otherwise the
// embeddings and the head stay whole on every rank.
#pragma once

#include <fsdp/tensor_parallel.h>
#include <models/llama/llama_config.h>

namespace fsdp::models {

// The plan for one decoder layer ("model.layers.N"), paths relative to it. Throws naming the
// counts if num_attention_heads, num_key_value_heads or intermediate_size does not divide by tp.
TensorParallelPlan llama_layer_tp_plan(const LlamaConfig& config, int tp,
                                       bool sequence_parallel = false);

// The plan for the root (LlamaForCausalLM: embeddings, final norm, head), paths relative to it:
// empty when tp is 1, or when vocab_size does not divide by tp without sequence parallelism.
TensorParallelPlan llama_root_tp_plan(const LlamaConfig& config, int tp, bool sequence_parallel);

}  // namespace fsdp::models
