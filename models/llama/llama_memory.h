// Llama as the memory estimator (include/fsdp/memory_estimate.h) sees it: the root unit's own
// parameters (embed_tokens, norm, lm_head unless tied), one unit per decoder layer, and the
// bytes autograd keeps for one micro-batch.
#pragma once

#include <c10/core/ScalarType.h>
#include <fsdp/memory_estimate.h>
#include <models/llama/llama.h>

#include <cstdint>

namespace fsdp::models {

// What autograd keeps (see llama.cpp's forward), for B sequences of T tokens, width d, query
// width h * head_dim, key/value width kv, MLP width f, h heads, vocabulary V, element size e of
// compute_dtype: per layer the layer's input and the residual sum in float32 (the RMSNorms' pow
// keeps them, in float32 even when computing in bf16), each RMSNorm's rsqrt [B, T, 1] float32
// and two [B, T, d] (the normalized value and its weighted output), the rotated q and the
// key/value heads repeated to h heads (or k and v themselves without grouping), the attention
// output and its float logsumexp, Qwen3's q and k norms (as a residual norm's, less the
// weighted output), and the MLP's gate output, its activation, the up output and their product
// ([B, T, f] each). After the layers: the final norm's as above
// and the float32 log-softmax of the logits [B, T, V] (models/common/memory.h). Not counted: the
// rotary table, cos and sin [T, head_dim], which the model keeps between steps. With activation
// checkpointing a layer keeps its input and the generator state and recomputes the rest during
// its backward.
// The saved bytes equal the counting allocator's measurement exactly, in fp32 and bf16, grouped
// or not, with and without checkpointing (tests/models/test_llama.cpp); the forward workspace
// and backward peaks are estimates from the same op sequence, not measured.
// With tensor parallelism over tp ranks (llama_layer_tp_plan), a layer's units hold one rank's
// slices and keep its heads' and MLP columns' activations (heads / tp, kv heads / tp,
// intermediate_size / tp); the norms' and the residual's stay whole, as does the root. With
// sequence parallelism as well, the norms (the final one too) run on this rank's 1/tp of the
// tokens and the residual stream between them is a sequence shard; the projections keep the
// gathered whole input.
ModelMemorySpec llama_memory_spec(const LlamaConfig& config, int64_t micro_batch, int64_t seq_len,
                                  at::ScalarType compute_dtype = at::kFloat,
                                  bool activation_checkpoint = false, int tp = 1,
                                  bool sequence_parallel = false);

}  // namespace fsdp::models
