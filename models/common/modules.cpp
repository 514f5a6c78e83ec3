// Shared model pieces; see modules.h. seed_for's constants must never change: every model's
// initial values (and so every recorded loss curve) depend on them.
#include <models/common/modules.h>

#include <fsdp/tensor_parallel.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <fsdp/runtime/forward.h>

namespace fsdp::models {
namespace {

constexpr uint64_t kFnvOffset = 14695981039346656037ULL;
constexpr uint64_t kFnvPrime = 1099511628211ULL;

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t seed_for(uint64_t seed, std::string_view name) {
  uint64_t hash = kFnvOffset;
  for (unsigned char ch : name) {
    hash ^= ch;
    hash *= kFnvPrime;
  }
  return splitmix64(seed ^ splitmix64(hash));
}

at::Tensor seeded_normal(at::IntArrayRef shape, double std, uint64_t seed, std::string_view name) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed_for(seed, name));
  return at::empty(shape, at::TensorOptions().dtype(at::kFloat)).normal_(0.0, std, gen);
}

TiedLinearImpl::TiedLinearImpl(const at::Tensor& tied_weight) {
  weight = register_parameter("weight", tied_weight, tied_weight.requires_grad());
}

at::Tensor TiedLinearImpl::forward(const at::Tensor& x) {
  return fsdp::tensor_parallel_linear(*this, x, weight);
}

namespace {

constexpr int64_t kIgnoreIndex = -100;  // fsdp/data/labeled.h's, which models cannot include

void check_loss_shapes(const at::Tensor& logits, const at::Tensor& targets) {
  TORCH_CHECK(logits.dim() == 3 && targets.dim() == 2 && logits.size(0) == targets.size(0) &&
                  logits.size(1) == targets.size(1),
              "loss expects logits [B, T, V] and targets [B, T], got logits ", logits.sizes(),
              " and targets ", targets.sizes());
}

// Reduced-precision logits only: float64 ones (the float64 equivalence tests) stay float64.
at::Tensor flat_logits(const at::Tensor& logits) {
  const at::Tensor flat = logits.reshape({-1, logits.size(2)});
  return c10::isReducedFloatingType(flat.scalar_type()) ? flat.to(at::kFloat) : flat;
}

}  // namespace

at::Tensor loss(const at::Tensor& logits, const at::Tensor& targets) {
  check_loss_shapes(logits, targets);
  return at::cross_entropy_loss(flat_logits(logits), targets.reshape({-1}));
}

at::Tensor summed_loss(const at::Tensor& logits, const at::Tensor& targets) {
  check_loss_shapes(logits, targets);
  return at::cross_entropy_loss(flat_logits(logits), targets.reshape({-1}), {}, at::Reduction::Sum,
                                kIgnoreIndex);
}

namespace {

// Per-target losses of logits [B, T, V / tp] split over the vocabulary by head.
at::Tensor vocab_parallel_losses(const at::Tensor& logits, const at::Tensor& targets,
                                 const torch::nn::Module& head) {
  check_loss_shapes(logits, targets);
  return fsdp::vocab_parallel_cross_entropy(head, logits.reshape({-1, logits.size(2)}),
                                            targets.reshape({-1}), kIgnoreIndex);
}

}  // namespace

at::Tensor loss(const at::Tensor& logits, const at::Tensor& targets,
                const torch::nn::Module& head) {
  if (!fsdp::splits_vocabulary(head)) return loss(logits, targets);
  // The mean over the targets that train, as at::cross_entropy_loss's.
  return vocab_parallel_losses(logits, targets, head).sum() / targets.ne(kIgnoreIndex).sum();
}

at::Tensor summed_loss(const at::Tensor& logits, const at::Tensor& targets,
                       const torch::nn::Module& head) {
  if (!fsdp::splits_vocabulary(head)) return summed_loss(logits, targets);
  return vocab_parallel_losses(logits, targets, head).sum();
}

torch::nn::Linear make_linear(const ParamSpec* weight, const ParamSpec* bias) {
  TORCH_INTERNAL_ASSERT(weight != nullptr && weight->shape.size() == 2, "a linear layer's weight");
  const int64_t out = weight->shape[0], in = weight->shape[1];
  TORCH_INTERNAL_ASSERT(bias == nullptr || bias->shape == std::vector<int64_t>{out}, "the bias of ",
                        weight->name, " is not [", out, "]");
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias != nullptr));
}

torch::nn::Linear layer_linear(const ParamTable& params, const std::string& name) {
  return make_linear(params.layer_param(name + ".weight"), params.layer_param(name + ".bias"));
}

at::Tensor linear(torch::nn::Linear layer, const at::Tensor& x) { return fsdp::linear(layer, x); }

at::Tensor layer_norm(torch::nn::LayerNorm norm, const at::Tensor& x) {
  return fsdp::forward_with(
      norm,
      [&norm](const at::Tensor& in) {
        const torch::nn::LayerNormOptions& o = norm->options;
        return at::layer_norm(in, o.normalized_shape(),
                              fsdp::tensor_parallel_parameter(*norm, norm->weight),
                              fsdp::tensor_parallel_parameter(*norm, norm->bias), o.eps());
      },
      x);
}

at::Tensor activate(Activation activation, const at::Tensor& x) {
  switch (activation) {
    case Activation::kSilu:
      return at::silu(x);
    case Activation::kGeluTanh:
      return at::gelu(x, "tanh");
  }
  TORCH_INTERNAL_ASSERT(false, "unhandled activation");
}

}  // namespace fsdp::models
