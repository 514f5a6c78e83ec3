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
//   the compute dtype, rotate_half; Qwen3's q/k norms before the rotation.
//
// [Note: a sliding window the sequence fits in]
// Mistral's sliding_window W lets position i attend to positions j with i - j < W. For a
// sequence of T <= W tokens every j <= i satisfies it, so the window changes nothing and the
// plain causal kernel computes the same attention. Longer sequences would need the banded mask:
// instead of building it, the model refuses them (LlamaConfig::max_seq_len() is the limit the
// trainer checks --seq-len against, and forward checks again).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <fsdp/activation_checkpoint.h>
#include <fsdp/runtime/forward.h>
#include <fsdp/tensor_parallel.h>
#include <models/llama/llama.h>

#include <cmath>
#include <optional>

namespace fsdp::models {
namespace {

constexpr double kInitStd = 0.02;  // transformers' initializer_range
constexpr char kEmbedName[] = "model.embed_tokens.weight";
constexpr char kHeadName[] = "lm_head.weight";

std::vector<ParamSpec> llama_layer_params(const LlamaConfig& c) {
  const int64_t d = c.hidden_size, f = c.intermediate_size, hd = c.head_dim();
  const int64_t q = c.num_attention_heads * hd, kv = c.num_key_value_heads * hd;
  const double out_std = kInitStd / std::sqrt(2.0 * static_cast<double>(c.num_hidden_layers));
  std::vector<ParamSpec> layer = {{"input_layernorm.weight", {d}, InitKind::kOnes}};
  auto add_linear = [&layer](const std::string& name, int64_t out, int64_t in, double std,
                             bool bias) {
    layer.push_back({name + ".weight", {out, in}, InitKind::kNormal, std});
    if (bias) layer.push_back({name + ".bias", {out}, InitKind::kZeros});
  };
  const bool qkv_bias = c.attention_bias != AttentionBias::kNone;
  add_linear("self_attn.q_proj", q, d, kInitStd, qkv_bias);
  add_linear("self_attn.k_proj", kv, d, kInitStd, qkv_bias);
  add_linear("self_attn.v_proj", kv, d, kInitStd, qkv_bias);
  add_linear("self_attn.o_proj", d, q, out_std, c.attention_bias == AttentionBias::kAll);
  if (c.qk_norm) {
    layer.push_back({"self_attn.q_norm.weight", {hd}, InitKind::kOnes});
    layer.push_back({"self_attn.k_norm.weight", {hd}, InitKind::kOnes});
  }
  layer.push_back({"post_attention_layernorm.weight", {d}, InitKind::kOnes});
  add_linear("mlp.gate_proj", f, d, kInitStd, c.mlp_bias);
  add_linear("mlp.up_proj", f, d, kInitStd, c.mlp_bias);
  add_linear("mlp.down_proj", d, f, out_std, c.mlp_bias);
  return layer;
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
  const std::optional<std::string> p = problem();
  TORCH_CHECK(!p, *p);
}

ParamTable llama_params(const LlamaConfig& c) {
  c.validate();
  ParamTable t;
  t.model = "Llama with num_hidden_layers=" + std::to_string(c.num_hidden_layers);
  const int64_t v = c.vocab_size, d = c.hidden_size;
  t.root = {{kEmbedName, {v, d}, InitKind::kNormal, kInitStd},
            {"model.norm.weight", {d}, InitKind::kOnes}};
  if (c.tie_word_embeddings) {
    t.tied = {{kHeadName, kEmbedName}};
  } else {
    t.root.push_back({kHeadName, {v, d}, InitKind::kNormal, kInitStd});
  }
  t.layer_prefix = "model.layers.";
  t.n_layers = c.num_hidden_layers;
  t.layer = llama_layer_params(c);
  return t;
}

int64_t num_parameters(const LlamaConfig& c) { return llama_params(c).num_parameters(); }

at::Tensor llama_inv_freq(const LlamaConfig& c) {
  // The same float32 operations as transformers (1.0 / t is t.reciprocal() * 1.0 there).
  const int64_t dim = c.head_dim();
  const at::Tensor exponent = at::arange(0, dim, 2, at::kLong).to(at::kFloat) / dim;
  at::Tensor inv_freq = at::reciprocal(at::pow(c10::Scalar(c.rope_theta), exponent));
  if (!c.rope_scaling) return inv_freq;
  const LlamaRopeScaling& s = *c.rope_scaling;
  if (s.rope_type == RopeType::kLinear) return inv_freq / s.factor;
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
  return llama_params(config).initial_value(hf_name, shape, seed);
}

// ---- modules ---------------------------------------------------------------------------------

LlamaRMSNormImpl::LlamaRMSNormImpl(int64_t dim, double eps) : eps_(eps) {
  weight = register_parameter("weight", at::ones({dim}));
}

at::Tensor LlamaRMSNormImpl::forward(const at::Tensor& x) {
  const at::Tensor h = x.to(at::kFloat);
  const at::Tensor normed = h * at::rsqrt(h.pow(2).mean(-1, /*keepdim=*/true) + eps_);
  // Under ReplicateParallel (Qwen3's q/k norms over this rank's heads) the weight's gradient is
  // summed over the tensor-parallel group.
  return fsdp::tensor_parallel_parameter(*this, weight) * normed.to(x.scalar_type());
}

LlamaRotary::LlamaRotary(const LlamaConfig& config) : inv_freq_(llama_inv_freq(config)) {}

std::pair<at::Tensor, at::Tensor> LlamaRotary::cos_sin(int64_t seq_len, at::ScalarType dtype,
                                                       c10::Device device) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (last_.seq_len != seq_len || last_.dtype != dtype || last_.device != device) {
    const at::Tensor positions = at::arange(seq_len, at::kLong).to(at::kFloat).unsqueeze(1);
    const at::Tensor freqs = positions * inv_freq_.unsqueeze(0);
    const at::Tensor angles = at::cat({freqs, freqs}, -1);
    last_ = Table{seq_len, dtype, device, angles.cos().to(dtype).to(device),
                  angles.sin().to(dtype).to(device)};
  }
  return {last_.cos, last_.sin};
}

LlamaAttentionImpl::LlamaAttentionImpl(const LlamaConfig& config, const ParamTable& params,
                                       std::shared_ptr<const LlamaRotary> rotary)
    : n_heads_(config.num_attention_heads),
      n_kv_heads_(config.num_key_value_heads),
      head_dim_(config.head_dim()),
      rotary_(std::move(rotary)) {
  q_proj = register_module("q_proj", layer_linear(params, "self_attn.q_proj"));
  k_proj = register_module("k_proj", layer_linear(params, "self_attn.k_proj"));
  v_proj = register_module("v_proj", layer_linear(params, "self_attn.v_proj"));
  o_proj = register_module("o_proj", layer_linear(params, "self_attn.o_proj"));
  if (config.qk_norm) {
    q_norm = register_module("q_norm", LlamaRMSNorm(head_dim_, config.rms_norm_eps));
    k_norm = register_module("k_norm", LlamaRMSNorm(head_dim_, config.rms_norm_eps));
  }
}

at::Tensor LlamaAttentionImpl::forward(const at::Tensor& input) {
  // Under sequence parallelism the input arrives as this rank's sequence shard: gathered here,
  // once for q, k and v.
  const at::Tensor x = fsdp::tensor_parallel_input(*this, input);
  const int64_t batch = x.size(0), seq = x.size(1);
  // [B, T, heads * head_dim] -> [B, T, heads, head_dim]. The head counts are read from the
  // projections' outputs: tensor parallelism leaves each rank heads / T of them.
  auto split = [&](const at::Tensor& t) { return t.view({batch, seq, -1, head_dim_}); };
  at::Tensor q = split(linear(q_proj, x));
  at::Tensor k = split(linear(k_proj, x));
  if (q_norm) {  // Qwen3: each head normalized before the rotation
    q = fsdp::forward(q_norm, q);
    k = fsdp::forward(k_norm, k);
  }
  // -> [B, heads, T, head_dim]
  q = q.transpose(1, 2);
  k = k.transpose(1, 2);
  at::Tensor v = split(linear(v_proj, x)).transpose(1, 2);
  const auto [cos, sin] = rotary_->cos_sin(seq, q.scalar_type(), q.device());
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
  y = y.transpose(1, 2).contiguous().view({batch, seq, -1});
  return linear(o_proj, y);
}

LlamaMLPImpl::LlamaMLPImpl(const LlamaConfig& config, const ParamTable& params)
    : act_(config.hidden_act) {
  gate_proj = register_module("gate_proj", layer_linear(params, "mlp.gate_proj"));
  up_proj = register_module("up_proj", layer_linear(params, "mlp.up_proj"));
  down_proj = register_module("down_proj", layer_linear(params, "mlp.down_proj"));
}

at::Tensor LlamaMLPImpl::forward(const at::Tensor& input) {
  const at::Tensor x = fsdp::tensor_parallel_input(*this, input);  // as attention's
  return linear(down_proj, activate(act_, linear(gate_proj, x)) * linear(up_proj, x));
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const LlamaConfig& config, const ParamTable& params,
                                             std::shared_ptr<const LlamaRotary> rotary,
                                             bool activation_checkpoint)
    : activation_checkpoint_(activation_checkpoint) {
  input_layernorm =
      register_module("input_layernorm", LlamaRMSNorm(config.hidden_size, config.rms_norm_eps));
  self_attn = register_module("self_attn", LlamaAttention(config, params, std::move(rotary)));
  post_attention_layernorm = register_module("post_attention_layernorm",
                                             LlamaRMSNorm(config.hidden_size, config.rms_norm_eps));
  mlp = register_module("mlp", LlamaMLP(config, params));
}

at::Tensor LlamaDecoderLayerImpl::forward(const at::Tensor& x) {
  if (!activation_checkpoint_) return body(x);
  // The recompute calls body on this module, so it reads the parameters FSDP has gathered for
  // the layer's backward.
  return fsdp::activation_checkpoint([this](const at::Tensor& in) { return body(in); }, x);
}

at::Tensor LlamaDecoderLayerImpl::body(const at::Tensor& x) {
  // Every module through fsdp::forward: any of them may be an FSDP unit (fsdp/wrap_policy.h).
  at::Tensor h = x + fsdp::forward(self_attn, fsdp::forward(input_layernorm, x));
  return h + fsdp::forward(mlp, fsdp::forward(post_attention_layernorm, h));
}

LlamaModelImpl::LlamaModelImpl(const LlamaOptions& options, const std::string& name_prefix)
    : config_(options.config()), params_(llama_params(options.config())) {
  const uint64_t seed = options.seed();
  embed_tokens = register_module("embed_tokens",
                                 torch::nn::Embedding(config_.vocab_size, config_.hidden_size));
  params_.init_module(*embed_tokens, name_prefix + "embed_tokens.", seed);
  auto rotary = std::make_shared<const LlamaRotary>(config_);
  layers = register_module("layers", torch::nn::ModuleList());
  decoder_layers.reserve(config_.num_hidden_layers);
  for (int64_t i = 0; i < config_.num_hidden_layers; ++i) {
    const std::string name = name_prefix + "layers." + std::to_string(i);
    LlamaDecoderLayer layer(config_, params_, rotary, options.activation_checkpoint());
    params_.init_module(*layer, name + ".", seed);
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
  // See [Note: a sliding window the sequence fits in].
  TORCH_CHECK(config_.sliding_window == 0 || idx.size(1) <= config_.sliding_window,
              "sequence length ", idx.size(1),
              " exceeds the model's sliding_window=", config_.sliding_window,
              ": attention over a sliding window is implemented only for "
              "sequences that fit in it (where it equals full causal attention)");
  // Under tensor parallelism the table may be split over the vocabulary, and under sequence
  // parallelism each rank keeps its sequence shard of the embeddings.
  at::Tensor x = fsdp::tensor_parallel_output(*embed_tokens, fsdp::embedding(embed_tokens, idx));
  for (auto& layer : decoder_layers) x = fsdp::forward(layer, x);
  return fsdp::forward(norm, x);
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const LlamaOptions& options) {
  model = register_module("model", LlamaModel(options, "model."));
  const ParamTable& params = model->params();
  if (options.config().tie_word_embeddings) {
    tied_head_ = register_module("lm_head", TiedLinear(model->embed_tokens->weight));
    lm_head = tied_head_.ptr();
  } else {
    untied_head_ = register_module("lm_head", make_linear(params.find("lm_head.weight"), nullptr));
    params.init_module(*untied_head_, "lm_head.", options.seed());
    lm_head = untied_head_.ptr();
  }
}

at::Tensor LlamaForCausalLMImpl::forward(const at::Tensor& idx) {
  // The head reads the whole sequence (gathered under sequence parallelism).
  const at::Tensor h = fsdp::tensor_parallel_input(*lm_head, fsdp::forward(model, idx));
  return tied_head_ ? fsdp::forward(tied_head_, h) : linear(untied_head_, h);
}

}  // namespace fsdp::models
