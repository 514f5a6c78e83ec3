// GPT-2 modules and their deterministic initialization.
//
// Invariants:
// - Every parameter's initial value is a pure function of (config, its HF name, seed):
//   init_parameter draws it from a generator of its own, so construction order, sharding,
//   threads and the global torch generator never change it. The torch::nn layers we build on
//   fill their weights from the global generator in their constructors; we overwrite every one
//   of those values before anyone can see them (which does advance the global stream).
// - lm_head.weight and transformer.wte.weight are one tensor; it is initialized once, under
//   the wte name.
// - Blocks are built, initialized and handed to on_block_built one at a time, so a callback
//   that shards each block keeps at most one full block alive during construction.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <fsdp/activation_checkpoint.h>
#include <fsdp/runtime/forward.h>
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

constexpr double kInitStd = 0.02;          // GPT-2's initializer_range
constexpr double kPositionInitStd = 0.01;  // GPT-2's original wpe initializer
constexpr char kTiedName[] = "lm_head.weight";
constexpr char kWteName[] = "transformer.wte.weight";

enum class InitKind { kNormal, kZeros, kOnes };

struct ParamSpec {
  std::vector<int64_t> shape;
  InitKind kind;
  double std = 0.0;
};

struct NamedSpec {
  const char* name;
  ParamSpec spec;
};

bool look_up(const std::vector<NamedSpec>& table, const std::string& name, ParamSpec& spec) {
  for (const auto& entry : table) {
    if (name == entry.name) {
      spec = entry.spec;
      return true;
    }
  }
  return false;
}

// The rest of name after "<prefix><layer>.", layer a decimal number without leading zeros,
// below n_layers; nullopt when name has no such form.
std::optional<std::string> layer_rest(const std::string& name, const std::string& prefix,
                                      int64_t n_layers) {
  if (name.compare(0, prefix.size(), prefix) != 0) return std::nullopt;
  const size_t pos = prefix.size();
  const size_t dot = name.find('.', pos);
  if (dot == std::string::npos || dot == pos || dot - pos > 9) return std::nullopt;
  int64_t layer = 0;
  for (size_t i = pos; i < dot; ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    layer = layer * 10 + (name[i] - '0');
  }
  if ((dot - pos > 1 && name[pos] == '0') || layer >= n_layers) return std::nullopt;
  return name.substr(dot + 1);
}

// Shape and initializer of the HF-named parameter name (lm_head.weight already mapped to wte),
// or false if GPT2LMHead(config) has no such parameter.
bool spec_of(const GPT2Config& c, const std::string& name, ParamSpec& spec) {
  const int64_t d = c.n_embd;
  const std::vector<NamedSpec> top = {
      {"transformer.wte.weight", {{c.vocab_size, d}, InitKind::kNormal, kInitStd}},
      {"transformer.wpe.weight", {{c.n_positions, d}, InitKind::kNormal, kPositionInitStd}},
      {"transformer.ln_f.weight", {{d}, InitKind::kOnes}},
      {"transformer.ln_f.bias", {{d}, InitKind::kZeros}},
  };
  if (look_up(top, name, spec)) return true;
  const std::optional<std::string> rest = layer_rest(name, "transformer.h.", c.n_layer);
  if (!rest) return false;
  const double proj_std = kInitStd / std::sqrt(2.0 * static_cast<double>(c.n_layer));
  const std::vector<NamedSpec> layer = {
      {"ln_1.weight", {{d}, InitKind::kOnes}},
      {"ln_2.weight", {{d}, InitKind::kOnes}},
      {"ln_1.bias", {{d}, InitKind::kZeros}},
      {"ln_2.bias", {{d}, InitKind::kZeros}},
      {"attn.c_attn.weight", {{3 * d, d}, InitKind::kNormal, kInitStd}},
      {"attn.c_attn.bias", {{3 * d}, InitKind::kZeros}},
      {"attn.c_proj.weight", {{d, d}, InitKind::kNormal, proj_std}},
      {"attn.c_proj.bias", {{d}, InitKind::kZeros}},
      {"mlp.c_fc.weight", {{4 * d, d}, InitKind::kNormal, kInitStd}},
      {"mlp.c_fc.bias", {{4 * d}, InitKind::kZeros}},
      {"mlp.c_proj.weight", {{d, 4 * d}, InitKind::kNormal, proj_std}},
      {"mlp.c_proj.bias", {{d}, InitKind::kZeros}},
  };
  return look_up(layer, *rest, spec);
}

// Overwrites every parameter of module (named prefix + local name) with its initial value.
void init_module(torch::nn::Module& module, const std::string& prefix, const GPT2Config& config,
                 uint64_t seed) {
  at::NoGradGuard no_grad;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    at::Tensor param = item.value();
    param.copy_(init_parameter(config, prefix + item.key(), param.sizes(), seed));
  }
}

// y = x W^T + b through at::linear, the op PyTorch's nn.Linear calls: for a contiguous [B, T, C]
// input it is one addmm with the bias fused, rounded once. torch::nn::Linear::forward (LibTorch's
// functional linear) instead runs matmul and then adds the bias in place for inputs of more than
// two dimensions, which in bf16 rounds twice: the same weights then give different bf16
// activations than PyTorch's (in fp32 the two gave identical results in our tests).
// Called through fsdp::forward_with, so the layer may be an FSDP unit of its own (an auto-wrap
// policy's choice).
at::Tensor linear(torch::nn::Linear layer, const at::Tensor& x) {
  return fsdp::forward_with(
      layer, [&layer](const at::Tensor& in) { return at::linear(in, layer->weight, layer->bias); },
      x);
}

torch::nn::LayerNorm make_layer_norm(const GPT2Config& config) {
  return torch::nn::LayerNorm(
      torch::nn::LayerNormOptions({config.n_embd}).eps(config.layer_norm_epsilon));
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
  TORCH_CHECK(vocab_size > 0 && n_positions > 0 && n_embd > 0 && n_layer > 0 && n_head > 0,
              "GPT-2 config sizes must be positive, got vocab_size=", vocab_size,
              " n_positions=", n_positions, " n_embd=", n_embd, " n_layer=", n_layer,
              " n_head=", n_head);
  TORCH_CHECK(n_embd % n_head == 0, "GPT-2 config: n_embd=", n_embd,
              " is not divisible by n_head=", n_head);
  TORCH_CHECK(layer_norm_epsilon > 0, "GPT-2 config: layer_norm_epsilon must be positive, got ",
              layer_norm_epsilon);
}

int64_t num_parameters(const GPT2Config& c) {
  const int64_t d = c.n_embd;
  const int64_t per_block = 2 * d                // ln_1
                            + 3 * d * d + 3 * d  // attn.c_attn
                            + d * d + d          // attn.c_proj
                            + 2 * d              // ln_2
                            + 4 * d * d + 4 * d  // mlp.c_fc
                            + 4 * d * d + d;     // mlp.c_proj
  return c.vocab_size * d + c.n_positions * d + c.n_layer * per_block + 2 * d;
}

// ---- initialization --------------------------------------------------------------------------

at::Tensor init_parameter(const GPT2Config& config, const std::string& hf_name,
                          at::IntArrayRef shape, uint64_t seed) {
  const std::string name = hf_name == kTiedName ? std::string(kWteName) : hf_name;
  ParamSpec spec;
  TORCH_CHECK(spec_of(config, name, spec), "'", hf_name,
              "' is not a parameter of GPT-2 with n_layer=", config.n_layer);
  TORCH_CHECK(shape == at::IntArrayRef(spec.shape), "parameter '", hf_name, "' has shape ", shape,
              " but this GPT-2 config gives it shape ", at::IntArrayRef(spec.shape),
              " (init_parameter builds full, unsharded values)");
  const auto options = at::TensorOptions().dtype(at::kFloat);
  switch (spec.kind) {
    case InitKind::kZeros:
      return at::zeros(shape, options);
    case InitKind::kOnes:
      return at::ones(shape, options);
    case InitKind::kNormal:
      return seeded_normal(shape, spec.std, seed, name);
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled init kind for ", hf_name);
}

void init_gpt2_parameters(GPT2LMHeadImpl& model, uint64_t seed) {
  at::NoGradGuard no_grad;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& item : model.named_parameters(/*recurse=*/true)) {
    at::Tensor param = item.value();
    if (!seen.insert(param.unsafeGetTensorImpl()).second) continue;  // tied: done once
    param.copy_(init_parameter(model.config(), item.key(), param.sizes(), seed));
  }
}

// ---- modules ---------------------------------------------------------------------------------

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GPT2Config& config)
    : n_head_(config.n_head) {
  config.validate();
  c_attn = register_module("c_attn", torch::nn::Linear(config.n_embd, 3 * config.n_embd));
  c_proj = register_module("c_proj", torch::nn::Linear(config.n_embd, config.n_embd));
}

at::Tensor CausalSelfAttentionImpl::forward(const at::Tensor& x) {
  const int64_t batch = x.size(0), seq = x.size(1), embd = x.size(2);
  const int64_t head_dim = embd / n_head_;
  std::vector<at::Tensor> qkv = linear(c_attn, x).split(embd, /*dim=*/2);
  // [B, T, C] -> [B, n_head, T, head_dim]
  auto heads = [&](const at::Tensor& t) {
    return t.view({batch, seq, n_head_, head_dim}).transpose(1, 2);
  };
  at::Tensor y = at::scaled_dot_product_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]),
                                                  /*attn_mask=*/std::nullopt,
                                                  /*dropout_p=*/0.0, /*is_causal=*/true);
  y = y.transpose(1, 2).contiguous().view({batch, seq, embd});
  return linear(c_proj, y);
}

MLPImpl::MLPImpl(const GPT2Config& config) {
  c_fc = register_module("c_fc", torch::nn::Linear(config.n_embd, 4 * config.n_embd));
  c_proj = register_module("c_proj", torch::nn::Linear(4 * config.n_embd, config.n_embd));
}

at::Tensor MLPImpl::forward(const at::Tensor& x) {
  return linear(c_proj, at::gelu(linear(c_fc, x), "tanh"));
}

BlockImpl::BlockImpl(const GPT2Config& config, bool activation_checkpoint)
    : activation_checkpoint_(activation_checkpoint) {
  ln_1 = register_module("ln_1", make_layer_norm(config));
  attn = register_module("attn", CausalSelfAttention(config));
  ln_2 = register_module("ln_2", make_layer_norm(config));
  mlp = register_module("mlp", MLP(config));
}

at::Tensor BlockImpl::forward(const at::Tensor& x) {
  if (!activation_checkpoint_) return body(x);
  // The recompute calls body on this module, so it reads the parameters FSDP has gathered for
  // the block's backward, not the ones forward saw.
  return fsdp::checkpoint([this](const at::Tensor& in) { return body(in); }, x);
}

at::Tensor BlockImpl::body(const at::Tensor& x) {
  // Every module through fsdp::forward: any of them may be an FSDP unit (fsdp/wrap_policy.h).
  at::Tensor h = x + fsdp::forward(attn, fsdp::forward(ln_1, x));
  return h + fsdp::forward(mlp, fsdp::forward(ln_2, h));
}

GPT2ModelImpl::GPT2ModelImpl(const GPT2Options& options, const std::string& name_prefix)
    : config_(options.config()) {
  config_.validate();
  const uint64_t seed = options.seed();
  wte = register_module("wte", torch::nn::Embedding(config_.vocab_size, config_.n_embd));
  init_module(*wte, name_prefix + "wte.", config_, seed);
  wpe = register_module("wpe", torch::nn::Embedding(config_.n_positions, config_.n_embd));
  init_module(*wpe, name_prefix + "wpe.", config_, seed);
  h = register_module("h", torch::nn::ModuleList());
  blocks.reserve(config_.n_layer);
  for (int64_t i = 0; i < config_.n_layer; ++i) {
    const std::string name = name_prefix + "h." + std::to_string(i);
    Block block(config_, options.activation_checkpoint());
    init_module(*block, name + ".", config_, seed);
    h->push_back(block);
    blocks.push_back(block);
    if (options.on_block_built()) options.on_block_built()(name, block.ptr());
  }
  ln_f = register_module("ln_f", make_layer_norm(config_));
  init_module(*ln_f, name_prefix + "ln_f.", config_, seed);
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
  at::Tensor x = fsdp::forward(wte, idx) + fsdp::forward(wpe, pos);
  for (auto& block : blocks) x = fsdp::forward(block, x);
  return fsdp::forward(ln_f, x);
}

GPT2LMHeadImpl::GPT2LMHeadImpl(const GPT2Options& options) {
  transformer = register_module("transformer", GPT2Model(options, "transformer."));
  lm_head = register_module("lm_head", TiedLinear(transformer->wte->weight));
}

at::Tensor GPT2LMHeadImpl::forward(const at::Tensor& idx) {
  return fsdp::forward(lm_head, fsdp::forward(transformer, idx));
}

}  // namespace fsdp::models
