// The MLP activations the models implement, under transformers' names (its ACT2FN keys). No
// LibTorch here: config.json parsing (models/hf/) builds without it, for fuzzing; the function
// that applies one is activate() in models/common/modules.h.
#pragma once

#include <optional>
#include <string_view>

namespace fsdp::models {

enum class Activation {
  kSilu,      // x * sigmoid(x): transformers' "silu" (and its alias "swish")
  kGeluTanh,  // GELU's tanh approximation: "gelu_new", "gelu_pytorch_tanh"
};

// The activation transformers calls name, or nullopt for one not implemented here.
inline std::optional<Activation> activation_named(std::string_view name) {
  if (name == "silu" || name == "swish") return Activation::kSilu;
  if (name == "gelu_new" || name == "gelu_pytorch_tanh") return Activation::kGeluTanh;
  return std::nullopt;
}

// The names activation_named accepts, for messages.
inline constexpr const char* kActivationNames = "silu, swish, gelu_new, gelu_pytorch_tanh";

}  // namespace fsdp::models
