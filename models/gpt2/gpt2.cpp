// GPT-2 modules and their deterministic initialization.
//
// Invariants:
// - Every parameter's initial value is a pure function of (config, its HF name, seed):
//   init_parameter draws it from a generator of its own, so construction order, sharding,
//   threads and the global torch generator never change it. The torch::nn layers we build on
//   fill their weights from the global generator in their constructors; we overwrite every one
//   of those values before anyone can see them (which does advance the global stream).
// - Tied (GPT-2's default), lm_head.weight and transformer.wte.weight are one tensor; it is
//   initialized once, under the wte name.
// - Blocks are built, initialized and handed to on_block_built one at a time, so a callback
//   that shards each block keeps at most one full block alive during construction.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <fsdp/activation_checkpoint.h>
#include <fsdp/runtime/forward.h>
#include <fsdp/tensor_parallel.h>
#include <models/gpt2/gpt2.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>
#include <optional>
#include <unordered_set>
#include <utility>

namespace fsdp::models {
namespace {

constexpr double kInitStd = 0.02;               // GPT-2's initializer_range
constexpr double kPositionInitStd = 0.01;       // GPT-2's original wpe initializer
constexpr char kTiedName[] = "lm_head.weight";  // tied to wte unless tie_word_embeddings is false
constexpr char kWteName[] = "transformer.wte.weight";

std::vector<ParamSpec> gpt2_layer_params(const GPT2Config& c) {
  const int64_t d = c.n_embd, inner = c.inner_size();
  const double proj_std = kInitStd / std::sqrt(2.0 * static_cast<double>(c.n_layer));
  return {
      {"ln_1.weight", {d}, InitKind::kOnes},
      {"ln_1.bias", {d}, InitKind::kZeros},
      {"attn.c_attn.weight", {3 * d, d}, InitKind::kNormal, kInitStd},
      {"attn.c_attn.bias", {3 * d}, InitKind::kZeros},
      {"attn.c_proj.weight", {d, d}, InitKind::kNormal, proj_std},
      {"attn.c_proj.bias", {d}, InitKind::kZeros},
      {"ln_2.weight", {d}, InitKind::kOnes},
      {"ln_2.bias", {d}, InitKind::kZeros},
      {"mlp.c_fc.weight", {inner, d}, InitKind::kNormal, kInitStd},
      {"mlp.c_fc.bias", {inner}, InitKind::kZeros},
      {"mlp.c_proj.weight", {d, inner}, InitKind::kNormal, proj_std},
      {"mlp.c_proj.bias", {d}, InitKind::kZeros},
  };
}

// The LayerNorm whose weight is the table's `weight`.
torch::nn::LayerNorm make_layer_norm(const ParamSpec* weight, const GPT2Config& config) {
  TORCH_INTERNAL_ASSERT(weight != nullptr, "a LayerNorm's weight");
  return torch::nn::LayerNorm(
      torch::nn::LayerNormOptions(weight->shape).eps(config.layer_norm_epsilon));
}

}  // namespace

// ---- configuration ---------------------------------------------------------------------------

GPT2Config GPT2Config::tiny() { return GPT2Config{256, 64, 32, 2, 2}; }
GPT2Config GPT2Config::small() { return GPT2Config{256, 256, 384, 8, 6}; }
GPT2Config GPT2Config::gpt2() { return GPT2Config{50257, 1024, 768, 12, 12}; }
GPT2Config GPT2Config::medium() { return GPT2Config{50257, 1024, 1024, 24, 16}; }
GPT2Config GPT2Config::large() { return GPT2Config{50257, 1024, 1280, 36, 20}; }
GPT2Config GPT2Config::xl() { return GPT2Config{50257, 1024, 1600, 48, 25}; }

std::vector<std::string> GPT2Config::names() {
  return {"tiny", "small", "gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"};
}

GPT2Config GPT2Config::by_name(const std::string& name) {
  if (name == "tiny") return tiny();
  if (name == "small") return small();
  if (name == "gpt2") return gpt2();
  if (name == "gpt2-medium") return medium();
  if (name == "gpt2-large") return large();
  if (name == "gpt2-xl") return xl();
  TORCH_CHECK(false, "unknown GPT-2 config '", name,
              "'; valid names are: tiny, small, gpt2, gpt2-medium, gpt2-large, gpt2-xl");
}

void GPT2Config::validate() const {
  const std::optional<std::string> p = problem();
  TORCH_CHECK(!p, *p);
}

ParamTable gpt2_params(const GPT2Config& c) {
  c.validate();
  ParamTable t;
  t.model = "GPT-2 with n_layer=" + std::to_string(c.n_layer);
  const int64_t v = c.vocab_size, d = c.n_embd;
  t.root = {{kWteName, {v, d}, InitKind::kNormal, kInitStd},
            {"transformer.wpe.weight", {c.n_positions, d}, InitKind::kNormal, kPositionInitStd},
            {"transformer.ln_f.weight", {d}, InitKind::kOnes},
            {"transformer.ln_f.bias", {d}, InitKind::kZeros}};
  if (c.tie_word_embeddings) {
    t.tied = {{kTiedName, kWteName}};
  } else {
    t.root.push_back({kTiedName, {v, d}, InitKind::kNormal, kInitStd});
  }
  t.layer_prefix = "transformer.h.";
  t.n_layers = c.n_layer;
  t.layer = gpt2_layer_params(c);
  return t;
}

int64_t num_parameters(const GPT2Config& c) { return gpt2_params(c).num_parameters(); }

// ---- initialization --------------------------------------------------------------------------

at::Tensor init_parameter(const GPT2Config& config, const std::string& hf_name,
                          at::IntArrayRef shape, uint64_t seed) {
  return gpt2_params(config).initial_value(hf_name, shape, seed);
}

void init_gpt2_parameters(GPT2LMHeadImpl& model, uint64_t seed) {
  at::NoGradGuard no_grad;
  const ParamTable& params = model.transformer->params();
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    at::Tensor param = item.value();
    if (!seen.insert(param.unsafeGetTensorImpl()).second) continue;  // tied: done once
    param.copy_(params.initial_value(item.key(), param.sizes(), seed));
  }
}

// ---- modules ---------------------------------------------------------------------------------

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GPT2Config& config, const ParamTable& params)
    : n_head_(config.n_head) {
  c_attn = register_module("c_attn", layer_linear(params, "attn.c_attn"));
  c_proj = register_module("c_proj", layer_linear(params, "attn.c_proj"));
}

at::Tensor CausalSelfAttentionImpl::forward(const at::Tensor& input) {
  // Under sequence parallelism the input arrives as this rank's sequence shard: gathered here.
  const at::Tensor x = fsdp::tensor_parallel_input(*this, input);
  const int64_t batch = x.size(0), seq = x.size(1), embd = x.size(2);
  const int64_t head_dim = embd / n_head_;
  // q, k and v: thirds of c_attn's output (each rank's heads of each under tensor parallelism,
  // whose packed split keeps the three blocks).
  std::vector<at::Tensor> qkv = linear(c_attn, x).chunk(3, /*dim=*/2);
  // [B, T, C] -> [B, n_head, T, head_dim] (n_head / T heads per rank under tensor parallelism)
  auto heads = [&](const at::Tensor& t) {
    return t.view({batch, seq, -1, head_dim}).transpose(1, 2);
  };
  at::Tensor y = at::scaled_dot_product_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]),
                                                  /*attn_mask=*/std::nullopt,
                                                  /*dropout_p=*/0.0, /*is_causal=*/true);
  y = y.transpose(1, 2).contiguous().view({batch, seq, -1});
  return linear(c_proj, y);
}

MLPImpl::MLPImpl(const GPT2Config& config, const ParamTable& params)
    : act_(config.activation_function) {
  c_fc = register_module("c_fc", layer_linear(params, "mlp.c_fc"));
  c_proj = register_module("c_proj", layer_linear(params, "mlp.c_proj"));
}

at::Tensor MLPImpl::forward(const at::Tensor& input) {
  const at::Tensor x = fsdp::tensor_parallel_input(*this, input);  // as attention's
  return linear(c_proj, activate(act_, linear(c_fc, x)));
}

BlockImpl::BlockImpl(const GPT2Config& config, const ParamTable& params, bool activation_checkpoint)
    : activation_checkpoint_(activation_checkpoint) {
  ln_1 = register_module("ln_1", make_layer_norm(params.layer_param("ln_1.weight"), config));
  attn = register_module("attn", CausalSelfAttention(config, params));
  ln_2 = register_module("ln_2", make_layer_norm(params.layer_param("ln_2.weight"), config));
  mlp = register_module("mlp", MLP(config, params));
}

at::Tensor BlockImpl::forward(const at::Tensor& x) {
  if (!activation_checkpoint_) return body(x);
  // The recompute calls body on this module, so it reads the parameters FSDP has gathered for
  // the block's backward, not the ones forward saw.
  return fsdp::activation_checkpoint([this](const at::Tensor& in) { return body(in); }, x);
}

at::Tensor BlockImpl::body(const at::Tensor& x) {
  // Every module through fsdp::forward: any of them may be an FSDP unit (fsdp/wrap_policy.h).
  at::Tensor h = x + fsdp::forward(attn, layer_norm(ln_1, x));
  return h + fsdp::forward(mlp, layer_norm(ln_2, h));
}

GPT2ModelImpl::GPT2ModelImpl(const GPT2Options& options, const std::string& name_prefix)
    : config_(options.config()), params_(gpt2_params(options.config())) {
  const uint64_t seed = options.seed();
  wte = register_module("wte", torch::nn::Embedding(config_.vocab_size, config_.n_embd));
  params_.init_module(*wte, name_prefix + "wte.", seed);
  wpe = register_module("wpe", torch::nn::Embedding(config_.n_positions, config_.n_embd));
  params_.init_module(*wpe, name_prefix + "wpe.", seed);
  h = register_module("h", torch::nn::ModuleList());
  blocks.reserve(config_.n_layer);
  for (int64_t i = 0; i < config_.n_layer; ++i) {
    const std::string name = name_prefix + "h." + std::to_string(i);
    Block block(config_, params_, options.activation_checkpoint());
    params_.init_module(*block, name + ".", seed);
    h->push_back(block);
    blocks.push_back(block);
    if (options.on_block_built()) options.on_block_built()(name, block.ptr());
  }
  ln_f =
      register_module("ln_f", make_layer_norm(params_.find(name_prefix + "ln_f.weight"), config_));
  params_.init_module(*ln_f, name_prefix + "ln_f.", seed);
}

at::Tensor GPT2ModelImpl::forward(const at::Tensor& idx) {
  TORCH_CHECK(idx.dim() == 2, "GPT-2 expects token ids of shape [batch, seq], got shape ",
              idx.sizes());
  TORCH_CHECK(idx.scalar_type() == at::kLong, "GPT-2 expects int64 token ids, got ",
              idx.scalar_type());
  const int64_t seq = idx.size(1);
  TORCH_CHECK(seq <= config_.n_positions, "sequence length ", seq,
              " exceeds the model's n_positions=", config_.n_positions);
  at::Tensor pos = at::arange(seq, idx.options());
  // Under tensor parallelism wte may be split over the vocabulary; under sequence parallelism
  // each rank keeps its sequence shard of both embeddings ([T, C] positions as [1, T, C]).
  at::Tensor x = fsdp::tensor_parallel_output(*wte, fsdp::embedding(wte, idx)) +
                 fsdp::tensor_parallel_output(*wpe, fsdp::embedding(wpe, pos).unsqueeze(0));
  for (auto& block : blocks) x = fsdp::forward(block, x);
  return layer_norm(ln_f, x);
}

GPT2LMHeadImpl::GPT2LMHeadImpl(const GPT2Options& options) {
  transformer = register_module("transformer", GPT2Model(options, "transformer."));
  const ParamTable& params = transformer->params();
  if (options.config().tie_word_embeddings) {
    lm_head = register_module("lm_head", TiedLinear(transformer->wte->weight));
  } else {
    untied_lm_head = register_module("lm_head", make_linear(params.find(kTiedName), nullptr));
    params.init_module(*untied_lm_head, "lm_head.", options.seed());
  }
}

at::Tensor GPT2LMHeadImpl::forward(const at::Tensor& idx) {
  // The head reads the whole sequence (gathered under sequence parallelism).
  const at::Tensor h = fsdp::tensor_parallel_input(head(), fsdp::forward(transformer, idx));
  return lm_head ? fsdp::forward(lm_head, h) : linear(untied_lm_head, h);
}

}  // namespace fsdp::models
