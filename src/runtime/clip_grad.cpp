// Global gradient norm over sharded gradients.
//
// Each rank reduces its shards to one local norm exactly as LibTorch's clip_grad_norm_ does
// (per-tensor norms, then the norm of those), then ranks sum the squares with one all-reduce.
// With one rank the all-reduce is skipped, so the result is LibTorch's, bit for bit.
#include <fsdp/clip_grad.h>

#include "runtime/param_group.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>

namespace fsdp {
namespace {

at::Tensor global_norm_tensor(const std::vector<at::Tensor>& grads, const DeviceMesh& mesh) {
  at::Tensor local;
  if (grads.empty()) {
    local = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(mesh.device()));
  } else {
    std::vector<at::Tensor> norms;
    norms.reserve(grads.size());
    for (const auto& g : grads) norms.push_back(g.norm(2));
    local = norms.size() == 1 ? norms[0] : at::stack(norms).norm(2);
  }
  if (mesh.shard_size() == 1) return local;
  // Offloaded gradients are on the host; the group communicates on the mesh's device (on CPU
  // both to() calls return the tensor itself).
  at::Tensor squared =
      (local.to(at::kDouble) * local.to(at::kDouble)).reshape({1}).to(mesh.device());
  const CollectiveLabel collective_label("clip_grad_norm");
  mesh.shard_group().all_reduce(squared, ReduceOp::kSum)->wait();
  return squared.sqrt().reshape({}).to(local.scalar_type()).to(local.device());
}

std::vector<at::Tensor> defined_grads(const std::vector<at::Tensor>& parameters) {
  std::vector<at::Tensor> grads;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const at::Tensor& p = parameters[i];
    if (!p.grad().defined()) continue;
    // Its gradient is this rank's own (never reduced) and its value whole on every rank, so
    // neither summing it over ranks nor counting it once gives the model's norm.
    TORCH_CHECK(!detail::is_ignored_parameter(p), "clip_grad_norm_: parameters[", i, "] (shape ",
                p.sizes(),
                ") is in a unit's FullyShardOptions::ignored_params, whose gradients are per "
                "rank; clip it separately, or leave it out of the list");
    grads.push_back(p.grad());
  }
  return grads;
}

}  // namespace

double grad_norm(const std::vector<at::Tensor>& parameters, const DeviceMesh& mesh) {
  at::NoGradGuard no_grad;
  return global_norm_tensor(defined_grads(parameters), mesh).item<double>();
}

double clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm,
                       const DeviceMesh& mesh) {
  TORCH_CHECK(max_norm > 0, "clip_grad_norm_: max_norm must be positive, got ", max_norm);
  at::NoGradGuard no_grad;
  const std::vector<at::Tensor> grads = defined_grads(parameters);
  const at::Tensor total = global_norm_tensor(grads, mesh);
  // Same coefficient arithmetic as torch::nn::utils::clip_grad_norm_.
  const at::Tensor coef = at::clamp(max_norm / (total + 1e-6), std::nullopt, 1.0);
  for (const auto& g : grads) g.mul_(coef);
  return total.item<double>();
}

}  // namespace fsdp
