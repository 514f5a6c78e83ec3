// Hugging Face config.json -> a model configuration, for the transformers classes implemented
// here: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM and Qwen3ForCausalLM (all built
// as models/llama/ with LlamaConfig's extra fields) and GPT2LMHeadModel (models/gpt2/).
//
// The rule: a model is never silently built differently from what transformers builds from the
// same file. Every field that changes the computation is read and honoured, or the file is
// refused naming the field; see [Note: which config.json fields count] in hf_config.cpp. A field
// missing from the file takes the value transformers' config class gives it, except the sizes
// that define the shapes (vocab_size, hidden_size, ...), which must be there. Every failure is an
// HfConfigError naming the field and the offending value, raised before anything allocates.
//
// No LibTorch here (nlohmann-json and the standard library only): this is fuzzed on its own
// (tests/fuzz/fuzz_hf_config.cpp). fsdp/models/model.h's model_spec_from_pretrained is the entry
// point for programs.
#pragma once

#include <models/gpt2/gpt2_config.h>
#include <models/llama/llama_config.h>

#include <cstddef>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace fsdp::models {

class HfConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The largest config.json accepted, in bytes (real ones are a few kB).
inline constexpr size_t kMaxHfConfigBytes = size_t{1} << 20;

struct HfConfig {
  std::string class_name;  // the transformers class: "Qwen3ForCausalLM"
  std::string model_type;  // its model_type: "qwen3"
  // Exactly one is set: llama for the four Llama-shaped classes, gpt2 for GPT2LMHeadModel. Each
  // satisfies its problem() == nullopt.
  std::optional<LlamaConfig> llama;
  std::optional<GPT2Config> gpt2;
};

// Parses and checks config.json's text. Throws HfConfigError.
HfConfig parse_hf_config(std::string_view json_text);

// The transformers classes parse_hf_config accepts, for messages: "LlamaForCausalLM, ...".
std::string hf_supported_classes();

}  // namespace fsdp::models
