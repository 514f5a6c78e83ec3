// Global gradient norm over sharded gradients.
//
// Each rank reduces its shards to one local norm exactly as LibTorch's clip_grad_norm_ does
// (per-tensor norms, then the norm of those), then ranks sum the squares with one all-reduce.
// With one rank the all-reduce is skipped, so the result is LibTorch's, bit for bit.
#include <fsdp/clip_grad.h>
#include <fsdp/tensor_parallel.h>

#include "runtime/param_group.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>

namespace fsdp {
namespace {

at::Tensor local_norm(const std::vector<at::Tensor>& grads, c10::Device device) {
  if (grads.empty()) return at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(device));
  std::vector<at::Tensor> norms;
  norms.reserve(grads.size());
  for (const auto& g : grads) norms.push_back(g.norm(2));
  return norms.size() == 1 ? norms[0] : at::stack(norms).norm(2);
}

at::Tensor squares(const at::Tensor& norm) {
  return (norm.to(at::kDouble) * norm.to(at::kDouble)).reshape({1});
}

// squared (float64, [1]) summed over group's ranks, on the group's device. Offloaded gradients
// are on the host; the group communicates on the mesh's device (on CPU both to() calls return
// the tensor itself).
at::Tensor summed_over(const at::Tensor& squared, ProcessGroup& group) {
  at::Tensor out = squared.to(group.device());
  const CollectiveLabel collective_label("clip_grad_norm");
  group.all_reduce(out, ReduceOp::kSum)->wait();
  return out;
}

// [Note: the norm over tensor-parallel slices]
// A gradient split by tensor parallelism holds a different slice on each rank of its group, and
// one that is not is the same on all of them. So the split ones' squares are summed over the
// tensor-parallel group and the others' counted once, before the sum over FSDP's shards. Without
// tensor parallelism the arithmetic is what it was before it existed.
at::Tensor global_norm_tensor(const std::vector<at::Tensor>& grads,
                              const std::vector<ProcessGroup*>& tp_groups, const DeviceMesh& mesh) {
  std::vector<at::Tensor> split, whole;
  ProcessGroup* tp = nullptr;
  for (size_t i = 0; i < grads.size(); ++i) {
    (tp_groups[i] ? split : whole).push_back(grads[i]);
    if (tp_groups[i]) tp = tp_groups[i];
  }
  const at::Tensor local = local_norm(whole, mesh.device());
  if (tp == nullptr && mesh.shard_size() == 1) return local;
  at::Tensor squared = squares(local).to(mesh.device());
  if (tp != nullptr)
    squared = squared + summed_over(squares(local_norm(split, mesh.device())), *tp);
  if (mesh.shard_size() > 1) squared = summed_over(squared, mesh.shard_group());
  const at::Tensor& like = whole.empty() ? split.front() : local;
  return squared.sqrt().reshape({}).to(like.scalar_type()).to(local.device());
}

struct Grads {
  std::vector<at::Tensor> grads;
  std::vector<ProcessGroup*> tp_groups;  // the group a gradient is split over, or null
};

Grads defined_grads(const std::vector<at::Tensor>& parameters) {
  Grads out;
  ProcessGroup* seen = nullptr;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const at::Tensor& p = parameters[i];
    if (!p.grad().defined()) continue;
    // Its gradient is this rank's own (never reduced) and its value whole on every rank, so
    // neither summing it over ranks nor counting it once gives the model's norm.
    TORCH_CHECK(!detail::is_ignored_parameter(p), "clip_grad_norm_: parameters[", i, "] (shape ",
                p.sizes(),
                ") is in a unit's FullyShardOptions::ignored_params, whose gradients are per "
                "rank; clip it separately, or leave it out of the list");
    const TensorParallelPlacement* placement = tensor_parallel_placement(p);
    ProcessGroup* tp = placement ? placement->group.get() : nullptr;
    TORCH_CHECK(tp == nullptr || seen == nullptr || tp == seen, "clip_grad_norm_: parameters[", i,
                "] is split over another tensor-parallel group than the parameters before it");
    if (tp != nullptr) seen = tp;
    out.grads.push_back(p.grad());
    out.tp_groups.push_back(tp);
  }
  return out;
}

}  // namespace

double grad_norm(const std::vector<at::Tensor>& parameters, const DeviceMesh& mesh) {
  at::NoGradGuard no_grad;
  const Grads g = defined_grads(parameters);
  return global_norm_tensor(g.grads, g.tp_groups, mesh).item<double>();
}

double clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm,
                       const DeviceMesh& mesh) {
  TORCH_CHECK(max_norm > 0, "clip_grad_norm_: max_norm must be positive, got ", max_norm);
  at::NoGradGuard no_grad;
  const Grads g = defined_grads(parameters);
  const std::vector<at::Tensor>& grads = g.grads;
  const at::Tensor total = global_norm_tensor(grads, g.tp_groups, mesh);
  // Same coefficient arithmetic as torch::nn::utils::clip_grad_norm_.
  const at::Tensor coef = at::clamp(max_norm / (total + 1e-6), std::nullopt, 1.0);
  for (const auto& g : grads) g.mul_(coef);
  return total.item<double>();
}

}  // namespace fsdp
