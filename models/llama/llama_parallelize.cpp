// The Llama decoder layer's tensor-parallel plan; see llama_parallelize.h.
#include <models/llama/llama_parallelize.h>

#include <c10/util/Exception.h>

namespace fsdp::models {

TensorParallelPlan llama_layer_tp_plan(const LlamaConfig& config, int tp) {
  TORCH_CHECK(tp >= 1, "tensor-parallel size ", tp, " must be at least 1");
  // Whole heads per rank: a head split across ranks would need its attention scores summed.
  TORCH_CHECK(config.num_attention_heads % tp == 0, "tensor parallelism over ", tp,
              " ranks needs num_attention_heads divisible by it, got ", config.num_attention_heads);
  TORCH_CHECK(config.num_key_value_heads % tp == 0, "tensor parallelism over ", tp,
              " ranks needs num_key_value_heads divisible by it, got ", config.num_key_value_heads,
              " (grouped-query attention: each rank keeps whole key/value heads)");
  TORCH_CHECK(config.intermediate_size % tp == 0, "tensor parallelism over ", tp,
              " ranks needs intermediate_size divisible by it, got ", config.intermediate_size);
  // Qwen3's per-head norms share one weight across heads, whose gradient would then be a partial
  // sum on each rank; summing it over the group is not built yet.
  TORCH_CHECK(!config.qk_norm,
              "tensor parallelism of a model with q/k norms (Qwen3's qk_norm) is "
              "not supported yet: their shared weight's gradient would need a sum over ranks");
  return {{"self_attn.q_proj", ColwiseParallel()}, {"self_attn.k_proj", ColwiseParallel()},
          {"self_attn.v_proj", ColwiseParallel()}, {"self_attn.o_proj", RowwiseParallel()},
          {"mlp.gate_proj", ColwiseParallel()},    {"mlp.up_proj", ColwiseParallel()},
          {"mlp.down_proj", RowwiseParallel()}};
}

}  // namespace fsdp::models
