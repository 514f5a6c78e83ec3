// The Llama decoder layer's tensor-parallel plan; see llama_parallelize.h.
#include <models/llama/llama_parallelize.h>

#include <models/common/parallelize.h>

#include <c10/util/Exception.h>

namespace fsdp::models {

TensorParallelPlan llama_layer_tp_plan(const LlamaConfig& config, int tp, bool sequence_parallel) {
  TORCH_CHECK(tp >= 1, "tensor-parallel size ", tp, " must be at least 1");
  // Whole heads per rank: a head split across ranks would need its attention scores summed.
  TORCH_CHECK(config.num_attention_heads % tp == 0, "tensor parallelism over ", tp,
              " ranks needs num_attention_heads divisible by it, got ", config.num_attention_heads);
  TORCH_CHECK(config.num_key_value_heads % tp == 0, "tensor parallelism over ", tp,
              " ranks needs num_key_value_heads divisible by it, got ", config.num_key_value_heads,
              " (grouped-query attention: each rank keeps whole key/value heads)");
  TORCH_CHECK(config.intermediate_size % tp == 0, "tensor parallelism over ", tp,
              " ranks needs intermediate_size divisible by it, got ", config.intermediate_size);
  // Under sequence parallelism the residual stream stays in sequence shards: the row layers
  // reduce-scatter into it, attention and the MLP gather their input once, the norms run on it.
  const Layout stream = sequence_parallel ? Layout::kSequenceShard : Layout::kReplicate;
  TensorParallelPlan plan = {
      {"self_attn.q_proj", ColwiseParallel()},   {"self_attn.k_proj", ColwiseParallel()},
      {"self_attn.v_proj", ColwiseParallel()},   {"self_attn.o_proj", RowwiseParallel(stream)},
      {"mlp.gate_proj", ColwiseParallel()},      {"mlp.up_proj", ColwiseParallel()},
      {"mlp.down_proj", RowwiseParallel(stream)}};
  if (sequence_parallel) {
    for (const char* norm : {"input_layernorm", "post_attention_layernorm"})
      plan.push_back({norm, SequenceParallel()});
    for (const char* block : {"self_attn", "mlp"})
      plan.push_back({block, PrepareModuleInput(Layout::kSequenceShard, Layout::kReplicate)});
  }
  if (config.qk_norm) {
    // Qwen3's per-head norms: one weight for every head, applied here to this rank's heads, so
    // its gradient is summed over the group.
    plan.push_back({"self_attn.q_norm", ReplicateParallel()});
    plan.push_back({"self_attn.k_norm", ReplicateParallel()});
  }
  return plan;
}

TensorParallelPlan llama_root_tp_plan(const LlamaConfig& config, int tp, bool sequence_parallel) {
  return root_tp_plan({"model.embed_tokens", "lm_head", "model.norm", ""}, config.vocab_size, tp,
                      sequence_parallel);
}

}  // namespace fsdp::models
