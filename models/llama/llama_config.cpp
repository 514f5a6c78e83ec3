// LlamaConfig's checks, without LibTorch (see llama_config.h). Messages name transformers'
// config.json fields and their values, so that a refused config.json says what to fix.
#include <models/common/config_limits.h>
#include <models/llama/llama_config.h>

#include <algorithm>
#include <cmath>
#include <sstream>

namespace fsdp::models {
namespace {

bool positive_finite(double x) { return x > 0 && std::isfinite(x); }

std::optional<std::string> rope_problem(const LlamaRopeScaling& s) {
  std::ostringstream out;
  if (s.rope_type == RopeType::kLinear) {
    if (positive_finite(s.factor)) return std::nullopt;
    out << "Llama config: rope_scaling (linear) needs a finite factor > 0, got factor=" << s.factor;
    return out.str();
  }
  if (positive_finite(s.factor) && positive_finite(s.low_freq_factor) &&
      std::isfinite(s.high_freq_factor) && s.high_freq_factor > s.low_freq_factor &&
      s.original_max_position_embeddings > 0 &&
      s.original_max_position_embeddings <= kMaxConfigSize) {
    return std::nullopt;
  }
  out << "Llama config: rope_scaling needs factor > 0, 0 < low_freq_factor < "
         "high_freq_factor and original_max_position_embeddings in [1, "
      << kMaxConfigSize << "], got factor=" << s.factor << " low_freq_factor=" << s.low_freq_factor
      << " high_freq_factor=" << s.high_freq_factor
      << " original_max_position_embeddings=" << s.original_max_position_embeddings;
  return out.str();
}

std::optional<std::string> size_problem(const LlamaConfig& c) {
  const int64_t sizes[] = {
      c.vocab_size,          c.hidden_size,         c.intermediate_size,      c.num_hidden_layers,
      c.num_attention_heads, c.num_key_value_heads, c.max_position_embeddings};
  const bool in_range = std::all_of(std::begin(sizes), std::end(sizes),
                                    [](int64_t s) { return s > 0 && s <= kMaxConfigSize; }) &&
                        c.explicit_head_dim >= 0 && c.explicit_head_dim <= kMaxConfigSize &&
                        c.sliding_window >= 0 && c.sliding_window <= kMaxConfigSize;
  if (in_range) return std::nullopt;
  std::ostringstream out;
  out << "Llama config sizes must be positive (and at most " << kMaxConfigSize
      << "), got vocab_size=" << c.vocab_size << " hidden_size=" << c.hidden_size
      << " intermediate_size=" << c.intermediate_size
      << " num_hidden_layers=" << c.num_hidden_layers
      << " num_attention_heads=" << c.num_attention_heads
      << " num_key_value_heads=" << c.num_key_value_heads
      << " max_position_embeddings=" << c.max_position_embeddings;
  if (c.explicit_head_dim != 0) out << " head_dim=" << c.explicit_head_dim;
  if (c.sliding_window != 0) out << " sliding_window=" << c.sliding_window;
  return out.str();
}

std::optional<std::string> shape_problem(const LlamaConfig& c) {
  std::ostringstream out;
  if (c.explicit_head_dim == 0 && c.hidden_size % c.num_attention_heads != 0) {
    out << "Llama config: hidden_size=" << c.hidden_size
        << " is not divisible by num_attention_heads=" << c.num_attention_heads;
  } else if (c.num_attention_heads % c.num_key_value_heads != 0) {
    out << "Llama config: num_attention_heads=" << c.num_attention_heads
        << " is not divisible by num_key_value_heads=" << c.num_key_value_heads;
  } else if (c.head_dim() % 2 != 0) {
    out << "Llama config: head_dim=" << c.head_dim()
        << (c.explicit_head_dim == 0 ? " (hidden_size / num_attention_heads)" : "")
        << " must be even for rotary embeddings";
  } else {
    // An upper estimate of the parameter count (norms and biases are far smaller).
    const long double d = c.hidden_size, q = c.num_attention_heads * c.head_dim();
    const long double kv = c.num_key_value_heads * c.head_dim();
    const long double weights =
        d * (2.0L * c.vocab_size +
             c.num_hidden_layers * (2.0L * q + 2.0L * kv + 3.0L * c.intermediate_size + 8.0L));
    if (weights <= kMaxConfigParameters) return std::nullopt;
    out << "Llama config: vocab_size=" << c.vocab_size << ", hidden_size=" << c.hidden_size
        << ", intermediate_size=" << c.intermediate_size
        << " and num_hidden_layers=" << c.num_hidden_layers << " make about " << weights
        << " parameters, more than 2^46";
  }
  return out.str();
}

}  // namespace

int64_t LlamaConfig::max_seq_len() const {
  return sliding_window > 0 ? std::min(max_position_embeddings, sliding_window)
                            : max_position_embeddings;
}

std::optional<std::string> LlamaConfig::problem() const {
  if (auto p = size_problem(*this)) return p;
  if (auto p = shape_problem(*this)) return p;
  if (!positive_finite(rms_norm_eps) || !positive_finite(rope_theta)) {
    std::ostringstream out;
    out << "Llama config: rms_norm_eps=" << rms_norm_eps << " and rope_theta=" << rope_theta
        << " must be positive and finite";
    return out.str();
  }
  if (rope_scaling) return rope_problem(*rope_scaling);
  return std::nullopt;
}

}  // namespace fsdp::models
