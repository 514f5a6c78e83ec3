// Llama 3 (Meta's Llama 3 / 3.1 / 3.2 text models) as torch::nn modules, with the parameter
// names of transformers' LlamaForCausalLM so that checkpoints map one to one:
//   model.embed_tokens.weight
//   model.layers.N.input_layernorm.weight, model.layers.N.post_attention_layernorm.weight
//   model.layers.N.self_attn.{q,k,v,o}_proj.weight, model.layers.N.mlp.{gate,up,down}_proj.weight
//   model.norm.weight, lm_head.weight (absent from files when tied to embed_tokens)
// Linear weights are [out, in] as in transformers; q_proj and k_proj rows are in transformers'
// order (rotary embedding by rotate_half, not Meta's interleaved pairs), so files load as they
// are. No dropout. The same modules are Mistral, Qwen2 and Qwen3 (see llama_config.h): the
// configuration adds biases (the projections' .bias), RMSNorm on each head of q and k
// (self_attn.{q,k}_norm.weight, Qwen3), an explicit head_dim, another activation, linear rope
// scaling, a sliding window the sequence must fit in.
//
// Architecture: pre-norm decoder layers x + attn(rms(x)), h + mlp(rms(h)); RMSNorm computed in
// float32 and cast back, as transformers does; rotary embeddings with base rope_theta and,
// optionally, frequency scaling (rope_scaling: Llama 3.1's or linear); grouped-query attention
// (each of num_key_value_heads key/value heads serves num_attention_heads / num_key_value_heads
// query heads) through at::scaled_dot_product_attention(is_causal); gated MLP
// down(act(gate(x)) * up(x)), act SiLU unless hidden_act says otherwise.
//
// FSDP: every decoder layer is an FSDP unit, called through fsdp::forward; embed_tokens, norm
// and lm_head stay in the root. Initialization is per parameter from (seed, name), as GPT-2's.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <models/common/modules.h>
#include <models/common/param_table.h>
#include <models/llama/llama_config.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::models {

// torchtitan's FeedForward width: int(2 * 4 * dim / 3) rounded up to a multiple of multiple_of.
int64_t llama_ffn_hidden_size(int64_t dim, int64_t multiple_of);

// Every parameter of LlamaForCausalLM(config): names, shapes and initializers (the one place
// Llama's shapes are written). Initialization: Linear and embedding weights N(0, 0.02), except
// o_proj and down_proj, N(0, 0.02 / sqrt(2 * num_hidden_layers)); norm weights 1; biases 0; a
// tied lm_head.weight is model.embed_tokens.weight.
ParamTable llama_params(const LlamaConfig& config);

// Distinct parameter elements of LlamaForCausalLM(config).
int64_t num_parameters(const LlamaConfig& config);

// The rotary inverse frequencies [head_dim / 2] (float32), rope_scaling applied, computed as
// transformers' _compute_default_rope_parameters / _compute_llama3_parameters do.
at::Tensor llama_inv_freq(const LlamaConfig& config);

// Initial value of the parameter called hf_name, as a new float32 CPU tensor of shape, from its
// own generator seeded by seed_for(seed, hf_name) (llama_params gives the scheme); a tied
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
//
// The angles are computed on the CPU, so that every device gets the same table bit for bit,
// and copied once to the device that asks; the last table is kept, since every layer of a
// forward (and its recomputation) asks for the same one, and a host-to-device copy per layer
// would stall the device.
class LlamaRotary {
 public:
  explicit LlamaRotary(const LlamaConfig& config);
  // cos, sin for seq_len positions in dtype, on device.
  std::pair<at::Tensor, at::Tensor> cos_sin(int64_t seq_len, at::ScalarType dtype,
                                            c10::Device device) const;
  const at::Tensor& inv_freq() const { return inv_freq_; }

 private:
  struct Table {
    int64_t seq_len = -1;
    at::ScalarType dtype = at::kFloat;
    c10::Device device = c10::kCPU;
    at::Tensor cos, sin;
  };
  at::Tensor inv_freq_;
  mutable std::mutex mutex_;  // The layers of a model share one rotary.
  mutable Table last_;
};

// Modules below are built from the model's ParamTable (llama_params): their sizes and biases
// are the table's.
class LlamaAttentionImpl : public torch::nn::Module {
 public:
  LlamaAttentionImpl(const LlamaConfig& config, const ParamTable& params,
                     std::shared_ptr<const LlamaRotary> rotary);
  at::Tensor forward(const at::Tensor& input);  // [B, T, d] -> [B, T, d]

  torch::nn::Linear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  LlamaRMSNorm q_norm{nullptr}, k_norm{nullptr};  // Qwen3's (qk_norm), else null

 private:
  int64_t n_heads_, n_kv_heads_, head_dim_;
  std::shared_ptr<const LlamaRotary> rotary_;
};
TORCH_MODULE(LlamaAttention);

class LlamaMLPImpl : public torch::nn::Module {
 public:
  LlamaMLPImpl(const LlamaConfig& config, const ParamTable& params);
  at::Tensor forward(const at::Tensor& input);  // down(act(gate(x)) * up(x))

  torch::nn::Linear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};

 private:
  Activation act_;
};
TORCH_MODULE(LlamaMLP);

class LlamaDecoderLayerImpl : public torch::nn::Module {
 public:
  LlamaDecoderLayerImpl(const LlamaConfig& config, const ParamTable& params,
                        std::shared_ptr<const LlamaRotary> rotary,
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
  // idx: [B, T] int64, T <= config().max_seq_len(). Returns hidden states [B, T, d].
  at::Tensor forward(const at::Tensor& idx);
  const LlamaConfig& config() const { return config_; }
  const ParamTable& params() const { return params_; }

  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  std::vector<LlamaDecoderLayer> decoder_layers;  // the same modules as layers, typed
  LlamaRMSNorm norm{nullptr};

 private:
  LlamaConfig config_;
  ParamTable params_;
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
