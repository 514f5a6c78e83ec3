// GPT-2's Hugging Face layout; see hf.h.
#include <models/gpt2/hf.h>

#include <nlohmann/json.hpp>

namespace fsdp::models {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

}  // namespace

fsdp::checkpoint::FullLayout gpt2_hf_layout(const GPT2Config& config) {
  fsdp::checkpoint::FullLayout layout;
  layout.transposed([](const std::string& name) {
    return ends_with(name, ".attn.c_attn.weight") || ends_with(name, ".attn.c_proj.weight") ||
           ends_with(name, ".mlp.c_fc.weight") || ends_with(name, ".mlp.c_proj.weight");
  });
  const bool tied = config.tie_word_embeddings;
  layout.from_file([tied](const std::string& key) -> std::optional<std::string> {
    if (ends_with(key, ".attn.bias") || ends_with(key, ".attn.masked_bias") ||
        (tied && key == "lm_head.weight")) {
      return std::nullopt;
    }
    for (const char* part : {"wte.", "wpe.", "h.", "ln_f."}) {
      if (starts_with(key, part)) return "transformer." + key;
    }
    return key;
  });
  return layout;
}

std::string gpt2_hf_config_json(const GPT2Config& c) {
  const nlohmann::json config = {
      {"architectures", {"GPT2LMHeadModel"}},
      {"model_type", "gpt2"},
      {"vocab_size", c.vocab_size},
      {"n_positions", c.n_positions},
      {"n_ctx", c.n_positions},
      {"n_embd", c.n_embd},
      {"n_layer", c.n_layer},
      {"n_head", c.n_head},
      {"n_inner", c.n_inner > 0 ? nlohmann::json(c.n_inner) : nlohmann::json(nullptr)},
      {"activation_function",
       c.activation_function == Activation::kSilu ? "silu" : "gelu_new"},  // tanh-GELU: ours
      {"layer_norm_epsilon", c.layer_norm_epsilon},
      {"resid_pdrop", 0.0},
      {"embd_pdrop", 0.0},
      {"attn_pdrop", 0.0},
      {"initializer_range", 0.02},
      {"scale_attn_weights", true},
      {"tie_word_embeddings", c.tie_word_embeddings},
      {"bos_token_id", c.vocab_size - 1},
      {"eos_token_id", c.vocab_size - 1},
      {"use_cache", true},
  };
  return config.dump(2) + "\n";
}

}  // namespace fsdp::models
