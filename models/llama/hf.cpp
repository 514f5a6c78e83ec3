// Llama's Hugging Face layout; see hf.h.
#include <models/llama/hf.h>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

namespace fsdp::models {

fsdp::checkpoint::FullLayout llama_hf_layout(const LlamaConfig& config) {
  fsdp::checkpoint::FullLayout layout;
  const bool tied = config.tie_word_embeddings;
  layout.from_file([tied](const std::string& key) -> std::optional<std::string> {
    const std::string inv_freq = "rotary_emb.inv_freq";
    if (key.size() >= inv_freq.size() &&
        key.compare(key.size() - inv_freq.size(), inv_freq.size(), inv_freq) == 0) {
      return std::nullopt;
    }
    if (tied && key == "lm_head.weight") return std::nullopt;
    return key;
  });
  return layout;
}

std::string llama_hf_config_json(const LlamaConfig& c, at::ScalarType dtype) {
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
              "llama_hf_config_json: no transformers name for dtype ", dtype);
  const char* dtype_name = dtype == at::kFloat      ? "float32"
                           : dtype == at::kBFloat16 ? "bfloat16"
                                                    : "float16";
  // Qwen2's and Qwen3's features and Mistral's window have no LlamaConfig field (a spec built
  // from their config.json writes that file instead: models/hf/).
  TORCH_CHECK(c.attention_bias != AttentionBias::kQkv && !c.qk_norm && c.sliding_window == 0,
              "llama_hf_config_json: q/k/v-only biases, q/k norms and sliding windows have no "
              "LlamaForCausalLM config.json field");
  nlohmann::json rope_scaling = nullptr;
  if (c.rope_scaling && c.rope_scaling->rope_type == RopeType::kLinear) {
    rope_scaling = {{"rope_type", "linear"}, {"factor", c.rope_scaling->factor}};
  } else if (c.rope_scaling) {
    rope_scaling = {
        {"rope_type", "llama3"},
        {"factor", c.rope_scaling->factor},
        {"low_freq_factor", c.rope_scaling->low_freq_factor},
        {"high_freq_factor", c.rope_scaling->high_freq_factor},
        {"original_max_position_embeddings", c.rope_scaling->original_max_position_embeddings}};
  }
  const nlohmann::json config = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"vocab_size", c.vocab_size},
      {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size},
      {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads},
      {"num_key_value_heads", c.num_key_value_heads},
      {"head_dim", c.head_dim()},
      {"hidden_act", c.hidden_act == Activation::kSilu ? "silu" : "gelu_pytorch_tanh"},
      {"max_position_embeddings", c.max_position_embeddings},
      {"rms_norm_eps", c.rms_norm_eps},
      {"rope_theta", c.rope_theta},
      {"rope_scaling", rope_scaling},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"attention_bias", c.attention_bias == AttentionBias::kAll},
      {"attention_dropout", 0.0},
      {"mlp_bias", c.mlp_bias},
      {"initializer_range", 0.02},
      {"pretraining_tp", 1},
      {"torch_dtype", dtype_name},
      {"bos_token_id", c.bos_token_id},
      {"eos_token_id", c.eos_token_id},
      {"use_cache", true},
  };
  return config.dump(2) + "\n";
}

}  // namespace fsdp::models
