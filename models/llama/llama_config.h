// Llama's configuration (transformers' LlamaConfig field names), shared by the Llama-shaped
// families transformers implements separately: LlamaForCausalLM, MistralForCausalLM,
// Qwen2ForCausalLM (q/k/v biases) and Qwen3ForCausalLM (RMSNorm on each head of q and k, an
// explicit head_dim). Each field changes the computation; the defaults are Llama 3's, and a
// registered configuration (llama.h) sets only the fields it names. No LibTorch here: config.json
// parsing (models/hf/) builds without it, for fuzzing.
#pragma once

#include <models/common/activation.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::models {

// transformers' rope_type of rope_scaling: the two frequency scalings implemented.
enum class RopeType {
  kLlama3,  // Llama 3.1's banded scaling
  kLinear,  // every inverse frequency divided by factor (position interpolation)
};

// rope_scaling. llama3: wavelengths above original_max_position_embeddings / low_freq_factor are
// stretched by factor, those below original_max_position_embeddings / high_freq_factor kept, and
// the band between interpolated. linear: every frequency divided by factor (the other fields
// unused).
struct LlamaRopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
  RopeType rope_type = RopeType::kLlama3;
};

// Which projections of the attention carry a bias.
enum class AttentionBias {
  kNone,
  kQkv,  // q, k and v (Qwen2)
  kAll,  // q, k, v and o (Llama's and Qwen3's attention_bias)
};

struct LlamaConfig {
  int64_t vocab_size = 256;
  int64_t hidden_size = 32;
  int64_t intermediate_size = 64;
  int64_t num_hidden_layers = 2;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 2;
  int64_t max_position_embeddings = 1024;  // longest sequence the model accepts
  double rms_norm_eps = 1e-5;
  double rope_theta = 500000.0;
  std::optional<LlamaRopeScaling> rope_scaling;
  bool tie_word_embeddings = false;
  int64_t bos_token_id = 0;
  int64_t eos_token_id = 0;
  // transformers' head_dim where config.json gives one; 0: hidden_size / num_attention_heads.
  // With it, q_proj is [num_attention_heads * head_dim, hidden_size], whatever hidden_size is.
  int64_t explicit_head_dim = 0;
  AttentionBias attention_bias = AttentionBias::kNone;
  bool mlp_bias = false;  // gate_proj, up_proj and down_proj carry biases
  bool qk_norm = false;   // Qwen3: RMSNorm (weight [head_dim]) on each head of q and k
  Activation hidden_act = Activation::kSilu;
  // Mistral's sliding_window (0: none). Attention then sees the last sliding_window positions
  // only, which is full causal attention while the sequence fits in the window: the model
  // accepts sequences of at most sliding_window tokens (max_seq_len) and nothing else changes.
  int64_t sliding_window = 0;

  // Named configurations (parameter counts with a tied lm_head counted once):
  //   llama-tiny   vocab 256, d 32, 2 layers, 4 heads / 2 kv, ffn 64, untied, rope scaling
  //                (factor 8, original 256: one frequency in each band):        34,976 (tests)
  //   llama-debug  torchtitan's debug model: vocab 2048, d 256, 6 layers, 16 heads / 16 kv,
  //                ffn 768 (multiple_of 256 over int(2 * 4d / 3)), theta 500000,
  //                untied:                                                   6,163,712
  //   llama-1b     Llama 3.2 1B: vocab 128256, d 2048, 16 layers, 32 / 8 heads, ffn 8192,
  //                tied, theta 500000, scaling factor 32:                 1,235,814,400
  //   llama-8b     Llama 3.1 8B: vocab 128256, d 4096, 32 layers, 32 / 8 heads, ffn 14336,
  //                untied, theta 500000, scaling factor 8:                8,030,261,248
  // (llama.cpp; they and by_name throw c10::Error, so they need LibTorch.)
  static LlamaConfig tiny();
  static LlamaConfig debug();
  static LlamaConfig llama3_2_1b();
  static LlamaConfig llama3_1_8b();
  // One of names(); throws listing the valid names otherwise.
  static LlamaConfig by_name(const std::string& name);
  static std::vector<std::string> names();

  int64_t head_dim() const {
    return explicit_head_dim > 0 ? explicit_head_dim : hidden_size / num_attention_heads;
  }
  // The longest sequence forward accepts: max_position_embeddings, or sliding_window if shorter.
  int64_t max_seq_len() const;
  // What is wrong with this configuration, naming the fields and values, or nullopt: sizes not
  // positive or so large that the parameter count leaves int64's comfortable range,
  // hidden_size % num_attention_heads (without an explicit head_dim),
  // num_attention_heads % num_key_value_heads, an odd head_dim, bad norm or rope parameters.
  std::optional<std::string> problem() const;
  // Throws c10::Error with problem()'s message (llama.cpp).
  void validate() const;
};

}  // namespace fsdp::models
