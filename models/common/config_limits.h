// The largest sizes a model configuration may name, shared by every family's checks
// (gpt2_config.cpp, llama_config.cpp, hf_config.cpp); no LibTorch, for the fuzz build.
#pragma once

#include <cstdint>

namespace fsdp::models {

// Largest accepted size of any one dimension, and of an upper estimate of the parameter count:
// every element and byte count derived from a configuration (parameters, gradients, optimizer
// state, memory estimates) then stays far inside int64.
constexpr int64_t kMaxConfigSize = int64_t{1} << 24;
constexpr long double kMaxConfigParameters = 0x1p46L;

}  // namespace fsdp::models
