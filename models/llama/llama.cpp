// Llama 3 modules, configurations and deterministic initialization.
//
// Invariants:
// - Every parameter's initial value is a pure function of (config, its HF name, seed), drawn
//   by init_parameter from a generator of its own; the torch::nn layers' own random fills are
//   overwritten before anyone sees them.
// - With tie_word_embeddings, lm_head.weight and model.embed_tokens.weight are one tensor,
//   initialized once under the embedding's name.
// - Decoder layers are built, initialized and handed to on_layer_built one at a time.
// - The numerics follow transformers' LlamaForCausalLM op for op where the order matters for
//   rounding: RMSNorm in float32 then cast, rotary angles in float32 (inverse frequencies by
//   the same sequence of float32 operations as transformers' rope functions), cos/sin cast to
//   the compute dtype, rotate_half.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <fsdp/activation_checkpoint.h>
#include <fsdp/runtime/forward.h>
#include <models/llama/llama.h>

#include <cmath>
#include <optional>
#include <unordered_set>

namespace fsdp::models {
namespace {

constexpr double kInitStd = 0.02;  // transformers' initializer_range
constexpr char kEmbedName[] = "model.embed_tokens.weight";
constexpr char kHeadName[] = "lm_head.weight";

enum class InitKind { kNormal, kOnes };

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

// Shape and initializer of the parameter called name, or false if there is none.
bool spec_of(const LlamaConfig& c, const std::string& name, ParamSpec& spec) {
  const int64_t d = c.hidden_size, f = c.intermediate_size;
  const int64_t kv = c.num_key_value_heads * c.head_dim();
  const std::vector<NamedSpec> top = {
      {kEmbedName, {{c.vocab_size, d}, InitKind::kNormal, kInitStd}},
      {kHeadName, {{c.vocab_size, d}, InitKind::kNormal, kInitStd}},
      {"model.norm.weight", {{d}, InitKind::kOnes}},
  };
  if (look_up(top, name, spec)) return true;
  const std::optional<std::string> rest = layer_rest(name, "model.layers.", c.num_hidden_layers);
  if (!rest) return false;
  const double out_std = kInitStd / std::sqrt(2.0 * static_cast<double>(c.num_hidden_layers));
  const std::vector<NamedSpec> layer = {
      {"input_layernorm.weight", {{d}, InitKind::kOnes}},
      {"post_attention_layernorm.weight", {{d}, InitKind::kOnes}},
      {"self_attn.q_proj.weight", {{d, d}, InitKind::kNormal, kInitStd}},
      {"self_attn.k_proj.weight", {{kv, d}, InitKind::kNormal, kInitStd}},
      {"self_attn.v_proj.weight", {{kv, d}, InitKind::kNormal, kInitStd}},
      {"self_attn.o_proj.weight", {{d, d}, InitKind::kNormal, out_std}},
      {"mlp.gate_proj.weight", {{f, d}, InitKind::kNormal, kInitStd}},
      {"mlp.up_proj.weight", {{f, d}, InitKind::kNormal, kInitStd}},
      {"mlp.down_proj.weight", {{d, f}, InitKind::kNormal, out_std}},
  };
  return look_up(layer, *rest, spec);
}

void init_module(torch::nn::Module& module, const std::string& prefix, const LlamaConfig& config,
                 uint64_t seed) {
  at::NoGradGuard no_grad;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    at::Tensor param = item.value();
    param.copy_(init_parameter(config, prefix + item.key(), param.sizes(), seed));
  }
}

torch::nn::Linear make_linear(int64_t in, int64_t out) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(false));
}

// Through fsdp::forward_with, so the layer may be an FSDP unit of its own (an auto-wrap
// policy's choice).
at::Tensor linear(torch::nn::Linear layer, const at::Tensor& x) {
  return fsdp::forward_with(
      layer, [&layer](const at::Tensor& in) { return at::linear(in, layer->weight); }, x);
}

// transformers' rotate_half: (x1, x2) -> (-x2, x1) over the two halves of the last dimension.
at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

}  // namespace

// ---- configuration ---------------------------------------------------------------------------

int64_t llama_ffn_hidden_size(int64_t dim, int64_t multiple_of) {
  const int64_t hidden = 2 * (4 * dim) / 3;
  return multiple_of * ((hidden + multiple_of - 1) / multiple_of);
}

LlamaConfig LlamaConfig::tiny() {
  LlamaConfig c;
  c.vocab_size = 256;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 1024;
  c.rope_theta = 500000.0;
  c.rope_scaling = LlamaRopeScaling{8.0, 1.0, 4.0, 256};
  c.bos_token_id = 0;
  c.eos_token_id = 0;
  return c;
}

LlamaConfig LlamaConfig::debug() {
  LlamaConfig c;
  c.vocab_size = 2048;
  c.hidden_size = 256;
  c.intermediate_size = llama_ffn_hidden_size(256, 256);
  c.num_hidden_layers = 6;
  c.num_attention_heads = 16;
  c.num_key_value_heads = 16;
  c.max_position_embeddings = 2048;
  c.rope_theta = 500000.0;
  c.bos_token_id = 0;
  c.eos_token_id = 1;
  return c;
}

LlamaConfig LlamaConfig::llama3_2_1b() {
  LlamaConfig c;
  c.vocab_size = 128256;
  c.hidden_size = 2048;
  c.intermediate_size = 8192;
  c.num_hidden_layers = 16;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  c.max_position_embeddings = 131072;
  c.rope_theta = 500000.0;
  c.rope_scaling = LlamaRopeScaling{32.0, 1.0, 4.0, 8192};
  c.tie_word_embeddings = true;
  c.bos_token_id = 128000;
  c.eos_token_id = 128001;
  return c;
}

LlamaConfig LlamaConfig::llama3_1_8b() {
  LlamaConfig c;
  c.vocab_size = 128256;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_hidden_layers = 32;
  c.num_attention_heads = 32;
  c.num_key_value_heads = 8;
  c.max_position_embeddings = 131072;
  c.rope_theta = 500000.0;
  c.rope_scaling = LlamaRopeScaling{8.0, 1.0, 4.0, 8192};
  c.bos_token_id = 128000;
  c.eos_token_id = 128001;
  return c;
}

std::vector<std::string> LlamaConfig::names() {
  return {"llama-tiny", "llama-debug", "llama-1b", "llama-8b"};
}

LlamaConfig LlamaConfig::by_name(const std::string& name) {
  if (name == "llama-tiny") return tiny();
  if (name == "llama-debug") return debug();
  if (name == "llama-1b") return llama3_2_1b();
  if (name == "llama-8b") return llama3_1_8b();
  TORCH_CHECK(false, "unknown Llama config '", name,
              "'; valid names are: llama-tiny, llama-debug, llama-1b, llama-8b");
}

void LlamaConfig::validate() const {
  TORCH_CHECK(vocab_size > 0 && hidden_size > 0 && intermediate_size > 0 && num_hidden_layers > 0 &&
                  num_attention_heads > 0 && num_key_value_heads > 0 && max_position_embeddings > 0,
              "Llama config sizes must be positive, got vocab_size=", vocab_size,
              " hidden_size=", hidden_size, " intermediate_size=", intermediate_size,
              " num_hidden_layers=", num_hidden_layers,
              " num_attention_heads=", num_attention_heads,
              " num_key_value_heads=", num_key_value_heads,
              " max_position_embeddings=", max_position_embeddings);
  TORCH_CHECK(hidden_size % num_attention_heads == 0, "Llama config: hidden_size=", hidden_size,
              " is not divisible by num_attention_heads=", num_attention_heads);
  TORCH_CHECK(num_attention_heads % num_key_value_heads == 0,
              "Llama config: num_attention_heads=", num_attention_heads,
              " is not divisible by num_key_value_heads=", num_key_value_heads);
  TORCH_CHECK(head_dim() % 2 == 0, "Llama config: head_dim=", head_dim(),
              " (hidden_size / num_attention_heads) must be even for rotary embeddings");
  TORCH_CHECK(rms_norm_eps > 0 && rope_theta > 0, "Llama config: rms_norm_eps=", rms_norm_eps,
              " and rope_theta=", rope_theta, " must be positive");
  if (rope_scaling) {
    const auto& s = *rope_scaling;
    TORCH_CHECK(s.factor > 0 && s.low_freq_factor > 0 && s.high_freq_factor > s.low_freq_factor &&
                    s.original_max_position_embeddings > 0,
                "Llama config: rope_scaling needs factor > 0, 0 < low_freq_factor < "
                "high_freq_factor and original_max_position_embeddings > 0, got factor=",
                s.factor, " low_freq_factor=", s.low_freq_factor,
                " high_freq_factor=", s.high_freq_factor,
                " original_max_position_embeddings=", s.original_max_position_embeddings);
  }
}

int64_t num_parameters(const LlamaConfig& c) {
  const int64_t d = c.hidden_size, f = c.intermediate_size;
  const int64_t kv = c.num_key_value_heads * c.head_dim();
  const int64_t per_layer = 2 * d         // input_layernorm, post_attention_layernorm
                            + 2 * d * d   // q_proj, o_proj
                            + 2 * kv * d  // k_proj, v_proj
                            + 3 * d * f;  // gate_proj, up_proj, down_proj
  const int64_t embeddings = c.vocab_size * d * (c.tie_word_embeddings ? 1 : 2);
  return embeddings + c.num_hidden_layers * per_layer + d;
}

at::Tensor llama_inv_freq(const LlamaConfig& c) {
  // The same float32 operations as transformers (1.0 / t is t.reciprocal() * 1.0 there).
  const int64_t dim = c.head_dim();
  const at::Tensor exponent = at::arange(0, dim, 2, at::kLong).to(at::kFloat) / dim;
  at::Tensor inv_freq = at::reciprocal(at::pow(c10::Scalar(c.rope_theta), exponent));
  if (!c.rope_scaling) return inv_freq;
  const LlamaRopeScaling& s = *c.rope_scaling;
  const double old_context = static_cast<double>(s.original_max_position_embeddings);
  const double low_freq_wavelen = old_context / s.low_freq_factor;
  const double high_freq_wavelen = old_context / s.high_freq_factor;
  const at::Tensor wavelen = at::reciprocal(inv_freq) * (2 * M_PI);
  at::Tensor scaled = at::where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq);
  const at::Tensor smooth = (at::reciprocal(wavelen) * old_context - s.low_freq_factor) /
                            (s.high_freq_factor - s.low_freq_factor);
  const at::Tensor smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled;
  const at::Tensor medium =
      (wavelen < high_freq_wavelen).logical_not() * (wavelen > low_freq_wavelen).logical_not();
  return at::where(medium, smoothed, scaled);
}

// ---- initialization --------------------------------------------------------------------------

at::Tensor init_parameter(const LlamaConfig& config, const std::string& hf_name,
                          at::IntArrayRef shape, uint64_t seed) {
  const std::string name =
      hf_name == kHeadName && config.tie_word_embeddings ? std::string(kEmbedName) : hf_name;
  ParamSpec spec;
  TORCH_CHECK(spec_of(config, name, spec), "'", hf_name,
              "' is not a parameter of Llama with num_hidden_layers=", config.num_hidden_layers);
  TORCH_CHECK(shape == at::IntArrayRef(spec.shape), "parameter '", hf_name, "' has shape ", shape,
              " but this Llama config gives it shape ", at::IntArrayRef(spec.shape),
              " (init_parameter builds full, unsharded values)");
  if (spec.kind == InitKind::kOnes) return at::ones(shape, at::kFloat);
  return seeded_normal(shape, spec.std, seed, name);
}

// ---- modules ---------------------------------------------------------------------------------

LlamaRMSNormImpl::LlamaRMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", at::ones({dim}));
}

at::Tensor LlamaRMSNormImpl::forward(const at::Tensor& x) {
  const at::Tensor h = x.to(at::kFloat);
  const at::Tensor normed = h * at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  return weight * normed.to(x.scalar_type());
}

LlamaRotary::LlamaRotary(const LlamaConfig& config) : inv_freq_(llama_inv_freq(config)) {}

std::pair<at::Tensor, at::Tensor> LlamaRotary::cos_sin(int64_t seq_len,
                                                       at::ScalarType dtype) const {
  const at::Tensor positions = at::arange(seq_len, at::kLong).to(at::kFloat).unsqueeze(1);
  const at::Tensor freqs = positions * inv_freq_.unsqueeze(0);
  const at::Tensor angles = at::cat({freqs, freqs}, -1);
  return {angles.cos().to(dtype), angles.sin().to(dtype)};
}

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& config,
                                       std::shared_ptr<const LlamaRotary> rotary)
    : n_heads_(config.num_attention_heads),
      n_kv_heads_(config.num_key_value_heads),
      head_dim_(config.head_dim()),
      rotary_(std::move(rotary)) {
  config.validate();
  const int64_t d = config.hidden_size, kv = n_kv_heads_ * head_dim_;
  q_proj = register_module("q_proj", make_linear(d, d));
  k_proj = register_module("k_proj", make_linear(d, kv));
  v_proj = register_module("v_proj", make_linear(d, kv));
  o_proj = register_module("o_proj", make_linear(d, d));
}

at::Tensor LlamaAttentionImpl::forward(const at::Tensor& x) {
  const int64_t batch = x.size(0), seq = x.size(1);
  // [B, T, heads * head_dim] -> [B, heads, T, head_dim]
  auto heads = [&](const at::Tensor& t, int64_t n) {
    return t.view({batch, seq, n, head_dim_}).transpose(1, 2);
  };
  at::Tensor q = heads(linear(q_proj, x), n_heads_);
  at::Tensor k = heads(linear(k_proj, x), n_kv_heads_);
  at::Tensor v = heads(linear(v_proj, x), n_kv_heads_);
  const auto [cos, sin] = rotary_->cos_sin(seq, q.scalar_type());
  q = q * cos + rotate_half(q) * sin;
  k = k * cos + rotate_half(k) * sin;
  if (n_kv_heads_ != n_heads_) {
    // Query head h reads key/value head h / (n_heads / n_kv_heads), as transformers' repeat_kv.
    // Repeating here keeps at::scaled_dot_product_attention on the CPU flash kernel.
    const int64_t rep = n_heads_ / n_kv_heads_;
    k = k.repeat_interleave(rep, /*dim=*/1);
    v = v.repeat_interleave(rep, /*dim=*/1);
  }
  at::Tensor y = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/std::nullopt,
                                                  /*dropout_p=*/0.0, /*is_causal=*/true);
  y = y.transpose(1, 2).contiguous().view({batch, seq, n_heads_ * head_dim_});
  return linear(o_proj, y);
}

LlamaMLPImpl::LlamaMLPImpl(const LlamaConfig& config) {
  const int64_t d = config.hidden_size, f = config.intermediate_size;
  gate_proj = register_module("gate_proj", make_linear(d, f));
  up_proj = register_module("up_proj", make_linear(d, f));
  down_proj = register_module("down_proj", make_linear(f, d));
}

at::Tensor LlamaMLPImpl::forward(const at::Tensor& x) {
  return linear(down_proj, at::silu(linear(gate_proj, x)) * linear(up_proj, x));
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const LlamaConfig& config,
                                             std::shared_ptr<const LlamaRotary> rotary,
                                             bool activation_checkpoint)
    : activation_checkpoint_(activation_checkpoint) {
  input_layernorm =
      register_module("input_layernorm", LlamaRMSNorm(config.hidden_size, config.rms_norm_eps));
  self_attn = register_module("self_attn", LlamaAttention(config, std::move(rotary)));
  post_attention_layernorm = register_module("post_attention_layernorm",
                                             LlamaRMSNorm(config.hidden_size, config.rms_norm_eps));
  mlp = register_module("mlp", LlamaMLP(config));
}

at::Tensor LlamaDecoderLayerImpl::forward(const at::Tensor& x) {
  if (!activation_checkpoint_) return body(x);
  // The recompute calls body on this module, so it reads the parameters FSDP has gathered for
  // the layer's backward.
  return fsdp::checkpoint([this](const at::Tensor& in) { return body(in); }, x);
}

at::Tensor LlamaDecoderLayerImpl::body(const at::Tensor& x) {
  // Every module through fsdp::forward: any of them may be an FSDP unit (fsdp/wrap_policy.h).
  at::Tensor h = x + fsdp::forward(self_attn, fsdp::forward(input_layernorm, x));
  return h + fsdp::forward(mlp, fsdp::forward(post_attention_layernorm, h));
}

LlamaModelImpl::LlamaModelImpl(const LlamaOptions& options, const std::string& name_prefix)
    : config_(options.config()) {
  config_.validate();
  const uint64_t seed = options.seed();
  embed_tokens = register_module("embed_tokens",
                                 torch::nn::Embedding(config_.vocab_size, config_.hidden_size));
  init_module(*embed_tokens, name_prefix + "embed_tokens.", config_, seed);
  auto rotary = std::make_shared<const LlamaRotary>(config_);
  layers = register_module("layers", torch::nn::ModuleList());
  decoder_layers.reserve(config_.num_hidden_layers);
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    const std::string name = name_prefix + "layers." + std::to_string(i);
    LlamaDecoderLayer layer(config_, rotary, options.activation_checkpoint());
    init_module(*layer, name + ".", config_, seed);
    layers->push_back(layer);
    decoder_layers.push_back(layer);
    if (options.on_layer_built()) options.on_layer_built()(name, layer.ptr());
  }
  norm = register_module("norm", LlamaRMSNorm(config_.hidden_size, config_.rms_norm_eps));
}

at::Tensor LlamaModelImpl::forward(const at::Tensor& idx) {
  TORCH_CHECK(idx.dim() == 2, "Llama expects token ids of shape [batch, seq], got shape ",
              idx.sizes());
  TORCH_CHECK(idx.scalar_type() == at::kLong, "Llama expects int64 token ids, got ",
              idx.scalar_type());
  TORCH_CHECK(idx.size(1) <= config_.max_position_embeddings, "sequence length ", idx.size(1),
              " exceeds the model's max_position_embeddings=", config_.max_position_embeddings);
  at::Tensor x = fsdp::forward(embed_tokens, idx);
  for (auto& layer : decoder_layers) x = fsdp::forward(layer, x);
  return fsdp::forward(norm, x);
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const LlamaOptions& options) {
  model = register_module("model", LlamaModel(options, "model."));
  if (options.config().tie_word_embeddings) {
    tied_head_ = register_module("lm_head", TiedLinear(model->embed_tokens->weight));
    lm_head = tied_head_.ptr();
  } else {
    untied_head_ = register_module(
        "lm_head", make_linear(options.config().hidden_size, options.config().vocab_size));
    init_module(*untied_head_, "lm_head.", options.config(), options.seed());
    lm_head = untied_head_.ptr();
  }
}

at::Tensor LlamaForCausalLMImpl::forward(const at::Tensor& idx) {
  const at::Tensor h = fsdp::forward(model, idx);
  return tied_head_ ? fsdp::forward(tied_head_, h) : linear(untied_head_, h);
}

}  // namespace fsdp::models
