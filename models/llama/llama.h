// Llama 3 (Meta's Llama 3 / 3.1 / 3.2 text models) as torch::nn modules, with the parameter
// names of transformers' LlamaForCausalLM so that checkpoints map one to one:
//   model.embed_tokens.weight
//   model.layers.N.input_layernorm.weight, model.layers.N.post_attention_layernorm.weight
//   model.layers.N.self_attn.{q,k,v,o}_proj.weight, model.layers.N.mlp.{gate,up,down}_proj.weight
//   model.norm.weight, lm_head.weight (absent from files when tied to embed_tokens)
// Linear weights are [out, in] as in transformers; q_proj and k_proj rows are in transformers'
// order (rotary embedding by rotate_half, not Meta's interleaved pairs), so files load as they
// are. No biases, no dropout.
//
// Architecture: pre-norm decoder layers x + attn(rms(x)), h + mlp(rms(h)); RMSNorm computed in
// float32 and cast back, as transformers does; rotary embeddings with base rope_theta and,
// optionally, Llama 3.1's frequency scaling (rope_scaling); grouped-query attention (each of
// num_key_value_heads key/value heads serves num_attention_heads / num_key_value_heads query
// heads) through at::scaled_dot_product_attention(is_causal); SwiGLU MLP
// down(silu(gate(x)) * up(x)).
//
// FSDP: every decoder layer is an FSDP unit, called through fsdp::forward; embed_tokens, norm
// and lm_head stay in the root. Initialization is per parameter from (seed, name), as GPT-2's.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <models/common/modules.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::models {

// Llama 3.1's rotary frequency scaling (transformers' rope_type "llama3"): wavelengths above
// original_max_position_embeddings / low_freq_factor are stretched by factor, those below
// original_max_position_embeddings / high_freq_factor kept, and the band between interpolated.
struct LlamaRopeScaling {
  double factor = 8.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// Field names are transformers' LlamaConfig's.
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
  static LlamaConfig tiny();
  static LlamaConfig debug();
  static LlamaConfig llama3_2_1b();
  static LlamaConfig llama3_1_8b();
  // One of names(); throws listing the valid names otherwise.
  static LlamaConfig by_name(const std::string& name);
  static std::vector<std::string> names();

  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  // Throws naming the offending values: sizes not positive, hidden_size % num_attention_heads,
  // num_attention_heads % num_key_value_heads, an odd head_dim, bad rope parameters.
  void validate() const;
};

// torchtitan's FeedForward width: int(2 * 4 * dim / 3) rounded up to a multiple of multiple_of.
int64_t llama_ffn_hidden_size(int64_t dim, int64_t multiple_of);

// Distinct parameter elements of LlamaForCausalLM(config).
int64_t num_parameters(const LlamaConfig& config);

// The rotary inverse frequencies [head_dim / 2] (float32), rope_scaling applied, computed as
// transformers' _compute_default_rope_parameters / _compute_llama3_parameters do.
at::Tensor llama_inv_freq(const LlamaConfig& config);

// Initial value of the parameter called hf_name, as a new float32 CPU tensor of shape, from its
// own generator seeded by seed_for(seed, hf_name): Linear and embedding weights N(0, 0.02),
// except o_proj and down_proj, N(0, 0.02 / sqrt(2 * num_hidden_layers)); norm weights 1; a tied
// lm_head.weight gets embed_tokens' values. Throws if hf_name is not a parameter of this config
// or shape is not its full shape.
at::Tensor init_parameter(const LlamaConfig& config, const std::string& hf_name,
                          at::IntArrayRef shape, uint64_t seed);

struct LlamaOptions {
  /* implicit */ LlamaOptions(LlamaConfig config) : config_(std::move(config)) {}
  TORCH_ARG(LlamaConfig, config);
  // Seed of the initial parameter values (see init_parameter). (optional) defaults to 0.
  TORCH_ARG(uint64_t, seed) = 0;
  // (optional) Called after each decoder layer ("model.layers.N") is built and initialized,
  // before the next one is built. Defaults to none.
  TORCH_ARG(UnitBuiltCallback, on_layer_built) = nullptr;
  // Each decoder layer runs under fsdp::checkpoint. (optional) defaults to false.
  TORCH_ARG(bool, activation_checkpoint) = false;
};

// Root mean square layer norm: weight * (x / sqrt(mean(x^2) + eps)), computed in float32.
class LlamaRMSNormImpl : public torch::nn::Module {
 public:
  LlamaRMSNormImpl(int64_t dim, double eps);
  at::Tensor forward(const at::Tensor& x);

  at::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(LlamaRMSNorm);

// cos and sin of the rotary angles for positions 0..T-1, [T, head_dim] in float32 (transformers'
// layout: the head_dim / 2 frequencies twice). Not a module and holds no buffer: nothing of it
// is saved in checkpoints (transformers' inv_freq is not persistent either).
class LlamaRotary {
 public:
  explicit LlamaRotary(const LlamaConfig& config);
  // cos, sin for seq_len positions in dtype.
  std::pair<at::Tensor, at::Tensor> cos_sin(int64_t seq_len, at::ScalarType dtype) const;
  const at::Tensor& inv_freq() const { return inv_freq_; }

 private:
  at::Tensor inv_freq_;
};

class LlamaAttentionImpl : public torch::nn::Module {
 public:
  LlamaAttentionImpl(const LlamaConfig& config, std::shared_ptr<const LlamaRotary> rotary);
  at::Tensor forward(const at::Tensor& x);  // [B, T, d] -> [B, T, d]

  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};

 private:
  int64_t n_heads_, n_kv_heads_, head_dim_;
  std::shared_ptr<const LlamaRotary> rotary_;
};
TORCH_MODULE(LlamaAttention);

class LlamaMLPImpl : public torch::nn::Module {
 public:
  explicit LlamaMLPImpl(const LlamaConfig& config);
  at::Tensor forward(const at::Tensor& x);  // down(silu(gate(x)) * up(x))

  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(LlamaMLP);

class LlamaDecoderLayerImpl : public torch::nn::Module {
 public:
  LlamaDecoderLayerImpl(const LlamaConfig& config, std::shared_ptr<const LlamaRotary> rotary,
                        bool activation_checkpoint = false);
  // With activation checkpointing, runs body under fsdp::checkpoint; otherwise body(x).
  at::Tensor forward(const at::Tensor& x);
  at::Tensor body(const at::Tensor& x);
  void set_activation_checkpoint(bool on) { activation_checkpoint_ = on; }

  LlamaRMSNorm input_layernorm{nullptr};
  LlamaAttention self_attn{nullptr};
  LlamaRMSNorm post_attention_layernorm{nullptr};
  LlamaMLP mlp{nullptr};

 private:
  bool activation_checkpoint_ = false;
};
TORCH_MODULE(LlamaDecoderLayer);

// transformers' LlamaModel: embeddings, decoder layers, final norm. name_prefix is this
// module's name inside the full model ("model.").
class LlamaModelImpl : public torch::nn::Module {
 public:
  explicit LlamaModelImpl(const LlamaOptions& options, const std::string& name_prefix = "");
  // idx: [B, T] int64, T <= max_position_embeddings. Returns hidden states [B, T, d].
  at::Tensor forward(const at::Tensor& idx);
  const LlamaConfig& config() const { return config_; }

  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  std::vector<LlamaDecoderLayer> decoder_layers;  // the same modules as layers, typed
  LlamaRMSNorm norm{nullptr};

 private:
  LlamaConfig config_;
};
TORCH_MODULE(LlamaModel);

// transformers' LlamaForCausalLM. With tie_word_embeddings, lm_head.weight is the very tensor
// model.embed_tokens.weight (give optimizers fsdp::unique_parameters(*model)).
class LlamaForCausalLMImpl : public torch::nn::Module {
 public:
  explicit LlamaForCausalLMImpl(const LlamaOptions& options);
  at::Tensor forward(const at::Tensor& idx);  // logits [B, T, vocab_size]
  const LlamaConfig& config() const { return model->config(); }

  LlamaModel model{nullptr};
  // A TiedLinear when tied, else a bias-free torch::nn::Linear.
  std::shared_ptr<torch::nn::Module> lm_head;

 private:
  torch::nn::Linear untied_head_{nullptr};
  TiedLinear tied_head_{nullptr};
};
TORCH_MODULE(LlamaForCausalLM);

}  // namespace fsdp::models
