// ShardedGradScaler (include/fsdp/grad_scaler.h).
//
// The arithmetic is PyTorch's own ATen kernels, the ones torch.amp.GradScaler calls, so a
// scaler fed the same gradients takes the same scales and skips the same steps bit for bit:
// _amp_foreach_non_finite_check_and_unscale_ multiplies by the float32 reciprocal of the scale
// (taken in float64, as GradScaler does) and raises found_inf on inf or nan;
// _amp_update_scale_ applies backoff or growth. The only addition is the all-reduce that makes
// every rank's found_inf the sum over the mesh (and over the tensor-parallel groups of split
// parameters, whose ranks hold different slices), without which a rank whose shard overflowed
// would skip a step the others take and the replicas would drift apart.
#include <fsdp/grad_scaler.h>
#include <fsdp/tensor_parallel.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace fsdp {
namespace {

void check_hyper_parameters(double growth_factor, double backoff_factor, int64_t growth_interval,
                            const char* who) {
  TORCH_CHECK(std::isfinite(growth_factor) && growth_factor > 1, who,
              ": growth_factor must be a finite number > 1, got ", growth_factor);
  TORCH_CHECK(backoff_factor > 0 && backoff_factor < 1, who,
              ": backoff_factor must be in (0, 1), got ", backoff_factor);
  TORCH_CHECK(growth_interval >= 1 && growth_interval <= std::numeric_limits<int32_t>::max(), who,
              ": growth_interval must be in [1, 2^31), got ", growth_interval);
}

void check_scale(double scale, const char* who) {
  TORCH_CHECK(std::isfinite(scale) && scale > 0 && scale <= std::numeric_limits<float>::max(), who,
              ": the scale must be a positive, finite float32 value, got ", scale);
}

// The gradients of optimizer's parameters, grouped by device and dtype as the fused kernel
// wants them.
std::map<std::pair<std::string, at::ScalarType>, std::vector<at::Tensor>> grads_by_kind(
    torch::optim::Optimizer& optimizer) {
  std::map<std::pair<std::string, at::ScalarType>, std::vector<at::Tensor>> groups;
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      const at::Tensor& g = p.grad();
      if (!g.defined()) continue;
      TORCH_CHECK(!g.is_sparse(), "ShardedGradScaler: sparse gradients are not supported");
      groups[{g.device().str(), g.scalar_type()}].push_back(g);
    }
  }
  return groups;
}

// The distinct tensor-parallel groups of optimizer's split parameters, in first-seen order
// (every rank of a group meets them in the same order: the same model, the same plan).
std::vector<ProcessGroup*> tensor_parallel_groups(torch::optim::Optimizer& optimizer) {
  std::vector<ProcessGroup*> groups;
  for (auto& group : optimizer.param_groups()) {
    for (auto& p : group.params()) {
      const TensorParallelPlacement* placement = tensor_parallel_placement(p);
      if (placement == nullptr) continue;
      ProcessGroup* g = placement->group.get();
      if (std::find(groups.begin(), groups.end(), g) == groups.end()) groups.push_back(g);
    }
  }
  return groups;
}

}  // namespace

ShardedGradScaler::ShardedGradScaler(std::optional<DeviceMesh> mesh,
                                     const GradScalerOptions& options)
    : mesh_(std::move(mesh)), options_(options) {
  check_scale(options.init_scale(), "ShardedGradScaler: init_scale");
  check_hyper_parameters(options.growth_factor(), options.backoff_factor(),
                         options.growth_interval(), "ShardedGradScaler");
  const auto device = mesh_ ? mesh_->device() : c10::Device(c10::kCPU);
  scale_ = at::full({}, options.init_scale(), at::TensorOptions().dtype(at::kFloat).device(device));
  growth_tracker_ = at::zeros({}, at::TensorOptions().dtype(at::kInt).device(device));
}

at::Tensor ShardedGradScaler::scale(const at::Tensor& loss) const {
  return loss * scale_.to(loss.device());
}

bool ShardedGradScaler::all_ranks_found_inf(
    at::Tensor found_inf, const std::vector<ProcessGroup*>& tensor_parallel_groups) const {
  const CollectiveLabel label("grad_scaler found_inf");
  // Over the slices first: then each shard group's ranks sum flags that cover their tp groups.
  for (ProcessGroup* tp : tensor_parallel_groups) tp->all_reduce(found_inf, ReduceOp::kSum)->wait();
  if (mesh_) {
    // Sum over the shard group, then across replicas: a flag on any rank reaches all of them.
    if (mesh_->shard_size() > 1) mesh_->shard_group().all_reduce(found_inf, ReduceOp::kSum)->wait();
    if (ProcessGroup* replicas = mesh_->replicate_group()) {
      replicas->all_reduce(found_inf, ReduceOp::kSum)->wait();
    }
  }
  return found_inf.item<float>() != 0;
}

bool ShardedGradScaler::unscale_(torch::optim::Optimizer& optimizer) {
  TORCH_CHECK(!found_inf_.has_value(),
              "ShardedGradScaler::unscale_ was already called since the last update()");
  at::NoGradGuard no_grad;
  // float64 reciprocal, then float32: what GradScaler.unscale_ does, so the quotients match.
  const at::Tensor inv_scale = scale_.to(at::kDouble).reciprocal().to(at::kFloat);
  at::Tensor found_inf = at::zeros({1}, scale_.options());
  for (auto& [kind, grads] : grads_by_kind(optimizer)) {
    const c10::Device device = grads.front().device();
    at::Tensor found_here = found_inf.to(device);
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_here, inv_scale.to(device));
    if (device != found_inf.device()) found_inf.add_(found_here.to(found_inf.device()));
  }
  found_inf_ = all_ranks_found_inf(found_inf, tensor_parallel_groups(optimizer));
  stepped_ = false;
  return *found_inf_;
}

bool ShardedGradScaler::step(torch::optim::Optimizer& optimizer) {
  TORCH_CHECK(!stepped_, "ShardedGradScaler::step was already called since the last update()");
  if (!found_inf_.has_value()) unscale_(optimizer);
  stepped_ = true;
  if (*found_inf_) return false;
  optimizer.step();
  return true;
}

void ShardedGradScaler::update() {
  TORCH_CHECK(found_inf_.has_value(),
              "ShardedGradScaler::update: no gradients were unscaled in this step (call unscale_ "
              "or step first)");
  const at::Tensor found = at::full({}, *found_inf_ ? 1.0 : 0.0, scale_.options());
  at::_amp_update_scale_(scale_, growth_tracker_, found, options_.growth_factor(),
                         options_.backoff_factor(), options_.growth_interval());
  found_inf_.reset();
  stepped_ = false;
}

double ShardedGradScaler::get_scale() const { return scale_.item<float>(); }

int64_t ShardedGradScaler::growth_tracker() const { return growth_tracker_.item<int32_t>(); }

GradScalerState ShardedGradScaler::state() const {
  GradScalerState s;
  s.scale = get_scale();
  s.growth_tracker = growth_tracker();
  s.growth_factor = options_.growth_factor();
  s.backoff_factor = options_.backoff_factor();
  s.growth_interval = options_.growth_interval();
  return s;
}

void ShardedGradScaler::load_state(const GradScalerState& state) {
  TORCH_CHECK(!found_inf_.has_value(),
              "ShardedGradScaler::load_state between unscale_ and update() would lose the step");
  check_scale(state.scale, "ShardedGradScaler::load_state");
  check_hyper_parameters(state.growth_factor, state.backoff_factor, state.growth_interval,
                         "ShardedGradScaler::load_state");
  TORCH_CHECK(state.growth_tracker >= 0 && state.growth_tracker < state.growth_interval,
              "ShardedGradScaler::load_state: growth_tracker must be in [0, growth_interval ",
              state.growth_interval, "), got ", state.growth_tracker);
  options_.growth_factor(state.growth_factor)
      .backoff_factor(state.backoff_factor)
      .growth_interval(state.growth_interval);
  scale_.fill_(state.scale);
  growth_tracker_.fill_(state.growth_tracker);
}

}  // namespace fsdp
