// GPT-2 as the memory estimator (include/fsdp/memory_estimate.h) sees it: the root unit's own
// parameters (wte, tied with lm_head, wpe, ln_f), one unit per block, and the bytes autograd
// keeps for one micro-batch.
#pragma once

#include <c10/core/ScalarType.h>
#include <fsdp/memory_estimate.h>
#include <models/gpt2/gpt2.h>

#include <cstdint>

namespace fsdp::models {

// One rank's micro-batch of micro_batch sequences of seq_len tokens, computed in compute_dtype
// (the mixed-precision param_dtype, or the parameters' own), with or without activation
// checkpointing of every block (GPT2Options::activation_checkpoint).
//
// What autograd keeps, for B sequences of T tokens, width d, h heads, vocabulary V, element
// size e (see gpt2.cpp's forward): per block 16 [B, T, d] tensors (ln_1 out, q/k/v = 3, the
// attention output, the residual sum, ln_2 out, the MLP's c_fc output and its GELU = 4 + 4, and
// the block's output, which the next block keeps as its input), the two LayerNorms' mean and
// rstd and the attention's logsumexp; before the blocks the position ids and the embedding
// sum; after them ln_f's output and statistics and the log-softmax of the logits [B, T, V].
// With checkpointing a block keeps only its output (the next block's input) and the generator
// state, and recomputes the rest during its backward.
// With tensor parallelism over tp ranks (gpt2_block_tp_plan), a block's units hold one rank's
// slices and keep its heads' q, k, v and attention output and its MLP columns' (/ tp); the
// LayerNorms', the residual's and the root's stay whole. With sequence parallelism as well, the
// LayerNorms run on this rank's 1/tp of the tokens and the residual stream is a sequence shard;
// c_attn, c_fc and the head keep their gathered whole inputs.
ModelMemorySpec gpt2_memory_spec(const GPT2Config& config, int64_t micro_batch, int64_t seq_len,
                                 at::ScalarType compute_dtype = at::kFloat,
                                 bool activation_checkpoint = false, int tp = 1,
                                 bool sequence_parallel = false);

}  // namespace fsdp::models
