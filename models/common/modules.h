// Pieces every model folder's modules share (fsdp/models/model.h is the registry's interface): the
// per-parameter seed that makes initialization a pure function of (seed, parameter name), and a
// linear layer over a weight owned by another module (tied input and output embeddings).
#pragma once

#include <fsdp/models/unit_built.h>
#include <models/common/activation.h>
#include <models/common/param_table.h>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

namespace fsdp::models {

// Mean cross-entropy (in nats) of logits [B, T, V] against targets [B, T] int64, computed in
// float32 at least: bf16 / fp16 logits are upcast before the log-softmax, as transformers and
// torchtitan do (a bf16 log-softmax over a large vocabulary loses the loss's low digits).
// Returns a float32 scalar (float64 for float64 logits).
at::Tensor loss(const at::Tensor& logits, const at::Tensor& targets);

// As loss, but summed over the targets that train, those not -100 (fine-tuning data's masked
// positions, PyTorch's ignore_index): the caller divides by the count of trained targets of the
// whole batch, which may span ranks. 0 when no target trains.
at::Tensor summed_loss(const at::Tensor& logits, const at::Tensor& targets);

// loss and summed_loss of logits from head, an output projection: when head splits the logits
// over the vocabulary (tensor parallelism's ColwiseParallel), without gathering them
// (fsdp::vocab_parallel_cross_entropy), else as above.
at::Tensor loss(const at::Tensor& logits, const at::Tensor& targets, const torch::nn::Module& head);
at::Tensor summed_loss(const at::Tensor& logits, const at::Tensor& targets,
                       const torch::nn::Module& head);

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

// A torch::nn::Linear of weight's shape [out, in], with a bias if bias is not null (its shape
// is checked against [out]). Its values are the layer's own random ones: ParamTable::init_module
// overwrites them.
torch::nn::Linear make_linear(const ParamSpec* weight, const ParamSpec* bias);
// make_linear of a layer's parameters "<name>.weight" and (if there is one) "<name>.bias".
torch::nn::Linear layer_linear(const ParamTable& params, const std::string& name);

// y = x W^T + b through at::linear, the op PyTorch's nn.Linear calls: for a contiguous [B, T, C]
// input it is one addmm with the bias fused, rounded once. torch::nn::Linear::forward (LibTorch's
// functional linear) instead runs matmul and then adds the bias in place for inputs of more than
// two dimensions, which in bf16 rounds twice: the same weights then give different bf16
// activations than PyTorch's. Called through fsdp::linear, so the layer may be an FSDP unit of
// its own (an auto-wrap policy's choice) and may be split by tensor parallelism.
at::Tensor linear(torch::nn::Linear layer, const at::Tensor& x);

// norm's forward (at::layer_norm, as torch::nn::LayerNorm's) through fsdp::forward_with, with
// its weight and bias read through fsdp::tensor_parallel_parameter: under SequenceParallel (the
// norm applied to this rank's sequence shard) their gradients are summed over the group.
at::Tensor layer_norm(torch::nn::LayerNorm norm, const at::Tensor& x);

// The activation applied elementwise, computed as transformers' class for it does on CPU.
at::Tensor activate(Activation activation, const at::Tensor& x);

}  // namespace fsdp::models
