// GPT-2's configuration (transformers' GPT2Config field names). Each field changes the
// computation. No LibTorch here: config.json parsing (models/hf/) builds without it, for fuzzing.
#pragma once

#include <models/common/activation.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::models {

struct GPT2Config {
  int64_t vocab_size = 256;
  int64_t n_positions = 64;  // longest sequence the model accepts
  int64_t n_embd = 32;
  int64_t n_layer = 2;
  int64_t n_head = 2;
  double layer_norm_epsilon = 1e-5;
  int64_t n_inner = 0;  // the MLP's width; 0: 4 * n_embd (transformers' n_inner = null)
  Activation activation_function = Activation::kGeluTanh;
  bool tie_word_embeddings = true;  // false: lm_head.weight is a parameter of its own

  // Named configurations. Parameter counts (tied lm_head counted once, see num_parameters):
  //   tiny         vocab 256,   ctx 64,   d 32,   2 layers,  2 heads:        35,712 (unit tests)
  //   small        vocab 256,   ctx 256,  d 384,  8 layers,  6 heads:    14,393,088 (CPU
  //   benchmarks) gpt2         vocab 50257, ctx 1024, d 768,  12 layers, 12 heads:  124,439,808 (HF
  //   "gpt2") gpt2-medium  vocab 50257, ctx 1024, d 1024, 24 layers, 16 heads:  354,823,168
  //   gpt2-large   vocab 50257, ctx 1024, d 1280, 36 layers, 20 heads:  774,030,080
  //   gpt2-xl      vocab 50257, ctx 1024, d 1600, 48 layers, 25 heads: 1,557,611,200
  // The trainer feeds byte-level tokens, so with the HF-sized configs only ids below 256 occur.
  // (gpt2.cpp; by_name throws c10::Error, so these need LibTorch.)
  static GPT2Config tiny();
  static GPT2Config small();
  static GPT2Config gpt2();
  static GPT2Config medium();
  static GPT2Config large();
  static GPT2Config xl();
  // One of names(); throws listing the valid names otherwise.
  static GPT2Config by_name(const std::string& name);
  static std::vector<std::string> names();

  int64_t inner_size() const { return n_inner > 0 ? n_inner : 4 * n_embd; }
  // What is wrong with this configuration, naming the fields and values, or nullopt: a size not
  // positive or too large, n_embd % n_head != 0, layer_norm_epsilon not positive.
  std::optional<std::string> problem() const;
  // Throws c10::Error with problem()'s message (gpt2.cpp).
  void validate() const;
};

}  // namespace fsdp::models
