// Shared model pieces; see modules.h. seed_for's constants must never change: every model's
// initial values (and so every recorded loss curve) depend on them.
#include <models/common/modules.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>

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

at::Tensor TiedLinearImpl::forward(const at::Tensor& x) { return at::linear(x, weight); }

at::Tensor loss(const at::Tensor& logits, const at::Tensor& targets) {
  TORCH_CHECK(logits.dim() == 3 && targets.dim() == 2 && logits.size(0) == targets.size(0) &&
                  logits.size(1) == targets.size(1),
              "loss expects logits [B, T, V] and targets [B, T], got logits ", logits.sizes(),
              " and targets ", targets.sizes());
  return at::cross_entropy_loss(logits.reshape({-1, logits.size(2)}), targets.reshape({-1}));
}

}  // namespace fsdp::models
