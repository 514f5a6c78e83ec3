// GPT-2 (Radford et al. 2019) as torch::nn modules, with Hugging Face's parameter names so that
// checkpoints map one to one: transformer.wte.weight, transformer.h.3.attn.c_attn.weight, ...,
// lm_head.weight. Linear weights use torch::nn::Linear's [out, in] layout; HF's Conv1D stores
// the transpose, so an exporter transposes c_attn, c_proj and c_fc weights.
//
// FSDP: every transformer block is meant to be one FSDP unit and the whole model the root unit.
// The model calls each block through fsdp::forward, so a block sharded with fully_shard gathers
// its parameters around its forward; an unsharded block is a plain call. The trainer calls the
// root as fsdp::forward(model, idx).
//
// Initialization never touches values drawn from the global torch generator (ranks run as
// threads, and a rank that builds only some parameters must still get the same values): each
// parameter is drawn from its own generator seeded from (seed, parameter name).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <models/common/modules.h>
#include <models/common/param_table.h>
#include <models/gpt2/gpt2_config.h>
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp::models {

// Every parameter of GPT2LMHead(config): names, shapes and initializers (the one place GPT-2's
// shapes are written). GPT-2's scheme: wte and Linear weights N(0, 0.02); c_proj weights
// (attention and MLP) N(0, 0.02 / sqrt(2 * n_layer)); wpe N(0, 0.01); biases 0; LayerNorm
// weight 1, bias 0; an untied lm_head.weight N(0, 0.02), a tied one is transformer.wte.weight.
ParamTable gpt2_params(const GPT2Config& config);

// Number of distinct parameter elements of GPT2LMHead(config); a tied lm_head.weight is the
// same tensor as transformer.wte.weight and is counted once.
int64_t num_parameters(const GPT2Config& config);

// Initial value of one parameter of GPT2LMHead(config), as a new float32 CPU tensor of the given
// shape, drawn from its own generator seeded by seed_for(seed, hf_name) (gpt2_params gives the
// scheme). A tied "lm_head.weight" gets "transformer.wte.weight"'s values. Thread-safe and
// independent of the global generator and of the order in which parameters are initialized.
// Throws if hf_name is not a parameter of this config or shape is not its shape.
at::Tensor init_parameter(const GPT2Config& config, const std::string& hf_name,
                          at::IntArrayRef shape, uint64_t seed);

// Called by GPT2Model's constructor right after block `name` (e.g. "transformer.h.3") is built
// and initialized, before the next block is built. unit is the block.
using BlockBuiltCallback = UnitBuiltCallback;

struct GPT2Options {
  /* implicit */ GPT2Options(GPT2Config config) : config_(std::move(config)) {}
  TORCH_ARG(GPT2Config, config);
  // Seed of the initial parameter values (see init_parameter). (optional) defaults to 0.
  TORCH_ARG(uint64_t, seed) = 0;
  // (optional) Called after each block is built and initialized. A caller that shards the block
  // here (fully_shard frees the full parameters, keeping 1/W of them) bounds the peak memory of
  // construction to the root's own parameters (wte, wpe, ln_f) plus one full block, instead of
  // the whole model. Defaults to none.
  TORCH_ARG(BlockBuiltCallback, on_block_built) = nullptr;
  // Each block runs its forward under fsdp::checkpoint: autograd keeps only the block's input,
  // and backward recomputes the block (after FSDP has gathered its parameters again). Trades
  // one more forward of every block for the activation memory of all but one block.
  // (optional) defaults to false.
  TORCH_ARG(bool, activation_checkpoint) = false;
};

// Causal multi-head self-attention: c_attn projects to q, k, v; c_proj mixes the heads.
// Uses at::scaled_dot_product_attention(is_causal=true). On CPU it runs the fused flash kernel,
// which gives bit-identical results from run to run, for any intra-op thread count and for any
// batch split (each (batch, head) pair is computed alone, in a fixed order), and needs no T x T
// score matrix. On CUDA its backward may use atomics, i.e. differ in the last bits between runs.
// Modules below are built from the model's ParamTable (gpt2_params): their sizes are the table's.
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  CausalSelfAttentionImpl(const GPT2Config& config, const ParamTable& params);
  at::Tensor forward(const at::Tensor& input);  // [B, T, n_embd] -> [B, T, n_embd]

  torch::nn::Linear c_attn{nullptr};
  torch::nn::Linear c_proj{nullptr};

 private:
  int64_t n_head_;
};
TORCH_MODULE(CausalSelfAttention);

class MLPImpl : public torch::nn::Module {
 public:
  MLPImpl(const GPT2Config& config, const ParamTable& params);
  at::Tensor forward(const at::Tensor& input);  // c_proj(act(c_fc(x))), act tanh-GELU by default

  torch::nn::Linear c_fc{nullptr};
  torch::nn::Linear c_proj{nullptr};

 private:
  Activation act_;
};
TORCH_MODULE(MLP);

// Pre-LayerNorm transformer block: x + attn(ln_1(x)), then + mlp(ln_2(.)). No dropout: training
// must be deterministic for the equivalence tests.
class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(const GPT2Config& config, const ParamTable& params, bool activation_checkpoint = false);
  // With activation checkpointing, runs body under fsdp::checkpoint; otherwise body(x).
  at::Tensor forward(const at::Tensor& x);
  at::Tensor body(const at::Tensor& x);
  void set_activation_checkpoint(bool on) { activation_checkpoint_ = on; }
  bool activation_checkpoint() const { return activation_checkpoint_; }

  torch::nn::LayerNorm ln_1{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::LayerNorm ln_2{nullptr};
  MLP mlp{nullptr};

 private:
  bool activation_checkpoint_ = false;
};
TORCH_MODULE(Block);

// Embeddings, blocks and the final LayerNorm (HF's GPT2Model). name_prefix is this module's
// name inside the full model ("transformer." under GPT2LMHead); it names the parameters for
// initialization and the blocks for on_block_built.
class GPT2ModelImpl : public torch::nn::Module {
 public:
  explicit GPT2ModelImpl(const GPT2Options& options, const std::string& name_prefix = "");
  // idx: [B, T] int64 token ids, T <= n_positions. Returns hidden states [B, T, n_embd].
  at::Tensor forward(const at::Tensor& idx);

  const GPT2Config& config() const { return config_; }
  const ParamTable& params() const { return params_; }

  torch::nn::Embedding wte{nullptr};
  torch::nn::Embedding wpe{nullptr};
  torch::nn::ModuleList h{nullptr};
  std::vector<Block> blocks;  // the same modules as h, typed, for fsdp::forward
  torch::nn::LayerNorm ln_f{nullptr};

 private:
  GPT2Config config_;
  ParamTable params_;
};
TORCH_MODULE(GPT2Model);

// (TiedLinear, used for lm_head, is in models/common/modules.h.)

// GPT-2 with its language-model head (HF's GPT2LMHeadModel). Tied (GPT-2's own choice),
// lm_head.weight is the very tensor transformer.wte.weight (same TensorImpl), as in HF; note that
// LibTorch's parameters() then lists it twice, so give optimizers fsdp::unique_parameters(*model).
// With tie_word_embeddings false it is a bias-free Linear of its own.
class GPT2LMHeadImpl : public torch::nn::Module {
 public:
  explicit GPT2LMHeadImpl(const GPT2Options& options);
  // idx: [B, T] int64. Returns logits [B, T, vocab_size].
  at::Tensor forward(const at::Tensor& idx);

  const GPT2Config& config() const { return transformer->config(); }
  // The output projection, tied or not (its tensor-parallel style says how it splits logits).
  const torch::nn::Module& head() const {
    return lm_head ? static_cast<const torch::nn::Module&>(*lm_head) : *untied_lm_head;
  }

  GPT2Model transformer{nullptr};
  TiedLinear lm_head{nullptr};                // tied; null when untied
  torch::nn::Linear untied_lm_head{nullptr};  // untied; null when tied
};
TORCH_MODULE(GPT2LMHead);

// Re-initializes every parameter of an unsharded model in place from init_parameter(config,
// name, shape, seed). The result equals a model constructed with GPT2Options(...).seed(seed),
// bit for bit. Throws if a parameter is sharded (its shape differs from the full shape).
void init_gpt2_parameters(GPT2LMHeadImpl& model, uint64_t seed);
inline void init_gpt2_parameters(GPT2LMHead& model, uint64_t seed) {
  init_gpt2_parameters(*model, seed);
}

}  // namespace fsdp::models
