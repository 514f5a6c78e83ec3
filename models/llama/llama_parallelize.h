// How a Llama decoder layer is split by tensor parallelism (torchtitan's Llama plan, without
// sequence parallelism): q/k/v and gate/up column-wise, o and down row-wise, so that attention
// runs on heads / T query heads and kv_heads / T key/value heads per rank and the MLP on
// intermediate_size / T features, with one all-reduce after attention and one after the MLP.
// Norms, embeddings and the output projection stay replicated; Qwen3's per-head q/k norms
// (qk_norm) are ReplicateParallel: applied to this rank's heads, their weights' gradients summed.
#pragma once

#include <fsdp/tensor_parallel.h>
#include <models/llama/llama_config.h>

namespace fsdp::models {

// The plan for one decoder layer ("model.layers.N"), paths relative to it. Throws naming the
// counts if num_attention_heads, num_key_value_heads or intermediate_size does not divide by tp.
TensorParallelPlan llama_layer_tp_plan(const LlamaConfig& config, int tp);

}  // namespace fsdp::models
