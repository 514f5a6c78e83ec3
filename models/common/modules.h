// Pieces every model folder shares (kept apart from models/model.h, whose checkpoint types
// clash with fsdp::checkpoint(), the activation-checkpointing call that model code uses): the
// per-parameter seed that makes initialization a pure function of (seed, parameter name), and a
// linear layer over a weight owned by another module (tied input and output embeddings).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace fsdp::models {

// Called during construction right after the unit called name (its full parameter prefix, e.g.
// "model.layers.3") is built and initialized, before the next unit is built.
using UnitBuiltCallback =
    std::function<void(const std::string& name, const std::shared_ptr<torch::nn::Module>& unit)>;

// Mean cross-entropy (in nats) of logits [B, T, V] against targets [B, T] int64.
at::Tensor loss(const at::Tensor& logits, const at::Tensor& targets);

// Seed of the generator that initializes the parameter called name (a Hugging Face name), for a
// model seeded with seed. Uses FNV-1a over the name (stable across compilers and runs, unlike
// std::hash) mixed with the seed through SplitMix64.
uint64_t seed_for(uint64_t seed, std::string_view name);

// A float32 CPU tensor of shape drawn from N(0, std) with a generator seeded by seed_for(seed,
// name): thread-safe and independent of the global generator.
at::Tensor seeded_normal(at::IntArrayRef shape, double std, uint64_t seed, std::string_view name);

// A bias-free linear layer whose weight is a tensor owned by another module (tied weights).
// torch::nn::Linear cannot be used here: its constructor allocates and randomly fills a weight
// of its own (154 MB for gpt2) and a Module cannot re-register a parameter name.
class TiedLinearImpl : public torch::nn::Module {
 public:
  explicit TiedLinearImpl(const at::Tensor& weight);  // weight: [out, in], registered as is
  at::Tensor forward(const at::Tensor& x);            // x @ weight^T

  at::Tensor weight;
};
TORCH_MODULE(TiedLinear);

}  // namespace fsdp::models
