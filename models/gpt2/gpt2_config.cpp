// GPT2Config's checks, without LibTorch (see gpt2_config.h). Messages name transformers'
// config.json fields and their values.
#include <models/common/config_limits.h>
#include <models/gpt2/gpt2_config.h>

#include <cmath>
#include <sstream>

namespace fsdp::models {

std::optional<std::string> GPT2Config::problem() const {
  std::ostringstream out;
  const auto ok = [](int64_t s) { return s > 0 && s <= kMaxConfigSize; };
  if (!ok(vocab_size) || !ok(n_positions) || !ok(n_embd) || !ok(n_layer) || !ok(n_head) ||
      n_inner < 0 || n_inner > kMaxConfigSize) {
    out << "GPT-2 config sizes must be positive (and at most " << kMaxConfigSize
        << "), got vocab_size=" << vocab_size << " n_positions=" << n_positions
        << " n_embd=" << n_embd << " n_layer=" << n_layer << " n_head=" << n_head;
    if (n_inner != 0) out << " n_inner=" << n_inner;
    return out.str();
  }
  if (n_embd % n_head != 0) {
    out << "GPT-2 config: n_embd=" << n_embd << " is not divisible by n_head=" << n_head;
    return out.str();
  }
  if (!(layer_norm_epsilon > 0) || !std::isfinite(layer_norm_epsilon)) {
    out << "GPT-2 config: layer_norm_epsilon must be positive and finite, got "
        << layer_norm_epsilon;
    return out.str();
  }
  // An upper estimate of the parameter count.
  const long double d = n_embd;
  const long double weights =
      d * (2.0L * vocab_size + n_positions + n_layer * (4.0L * d + 2.0L * inner_size() + 16.0L));
  if (weights > kMaxConfigParameters) {
    out << "GPT-2 config: vocab_size=" << vocab_size << ", n_embd=" << n_embd
        << " and n_layer=" << n_layer << " make about " << weights << " parameters, more than 2^46";
    return out.str();
  }
  return std::nullopt;
}

}  // namespace fsdp::models
