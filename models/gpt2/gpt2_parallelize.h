// How a GPT-2 block is split by tensor parallelism (Megatron-LM's GPT-2 split): the fused q/k/v
// projection c_attn column-wise in three packed blocks (each rank keeps its heads of q, k and
// v), c_fc column-wise, both c_proj row-wise (their biases added once, after the sum). The layer
// norms stay whole. When vocab_size divides by tp, wte (and the head, tied to it or not) splits
// over the vocabulary, the loss computed without gathering the logits (as Llama's root);
// otherwise (GPT-2's own 50,257 tokens over an even tp) the embeddings and head stay whole. With
// sequence parallelism, as Llama's plan (models/llama/llama_parallelize.h): the residual stream in
// sequence shards, the norms on them, both embeddings scattered into them and the head's input
// gathered.
#pragma once

#include <fsdp/tensor_parallel.h>
#include <models/gpt2/gpt2_config.h>

namespace fsdp::models {

// The plan for one block ("transformer.h.N"), paths relative to it. Throws naming the counts if
// n_head or the MLP's width does not divide by tp.
TensorParallelPlan gpt2_block_tp_plan(const GPT2Config& config, int tp,
                                      bool sequence_parallel = false);

// The plan for the root (GPT2LMHead: embeddings, final norm, head), paths relative to it:
// empty when tp is 1, or when vocab_size does not divide by tp without sequence parallelism.
TensorParallelPlan gpt2_root_tp_plan(const GPT2Config& config, int tp, bool sequence_parallel);

}  // namespace fsdp::models
