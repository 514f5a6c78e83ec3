// libFuzzer target: config.json parsing (models/hf/hf_config.cpp) on arbitrary bytes (see
// run_fuzz.sh). Any input must either parse into a configuration that passes its own checks
// and whose parameter count fits comfortably in int64, or throw HfConfigError; anything else
// (another exception, a sanitizer report, a trap) is a bug.
#include <models/hf/hf_config.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fsdp::models;
  HfConfig config;
  try {
    config = parse_hf_config(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const HfConfigError&) {
    return 0;
  }
  if (config.llama.has_value() == config.gpt2.has_value()) __builtin_trap();
  if (config.llama) {
    const LlamaConfig& c = *config.llama;
    if (c.problem() || c.head_dim() <= 0 || c.head_dim() % 2 != 0 || c.max_seq_len() < 1 ||
        c.num_attention_heads % c.num_key_value_heads != 0) {
      __builtin_trap();
    }
    // The widths the model multiplies must not overflow.
    const long double q = static_cast<long double>(c.num_attention_heads) * c.head_dim();
    if (q * c.hidden_size > 0x1p50L) __builtin_trap();
  } else {
    const GPT2Config& c = *config.gpt2;
    if (c.problem() || c.n_embd % c.n_head != 0 || c.inner_size() < 1) __builtin_trap();
  }
  return 0;
}
