// What a model computes, for the planner (fsdp/step_time_plan.h), derived from the model
// interface without building the model: the matmuls from the parameter shapes the model gives
// the memory estimator, attention from its width and heads, the rest from its saved activations.
#pragma once

#include <fsdp/models/model.h>
#include <fsdp/step_time_plan.h>

namespace fsdp::tools {

// One rank's micro_batch sequences of seq_len tokens. Assumes what holds for every registered
// family (GPT-2, Llama): each unit is a transformer block whose 2-D (and larger) parameters are
// weights applied to every token ([out, in...]: a [tokens, in] x [in, out] matmul), with causal
// self-attention over the sequence at the model's width; the root's [vocab, width] parameter is
// the output head (a tied embedding too) and its other parameters are looked up, not multiplied.
// Work outside matmuls and attention is taken as three passes over every activation the unit
// saves for backward: the op that makes it writes it, the next op reads it, and the elementwise
// chains around them (norms, rotary embeddings, gating, residual adds) touch it about once more
// (a count of Llama's and GPT-2's ops, not a fit to timings). Under tensor parallelism over tp
// ranks it is one rank's part: the family's plan's slices of the layers (the memory spec's), its
// tp-th of the heads, the head's rows under a vocabulary split, and model_forward_flops the whole
// model's. Throws naming the sizes when the family reports no width or heads, or the heads do
// not divide by tp.
ModelComputeSpec compute_spec(const models::ModelSpec& spec, int64_t micro_batch, int64_t seq_len,
                              at::ScalarType compute_dtype, int tp = 1,
                              bool sequence_parallel = false);

}  // namespace fsdp::tools
