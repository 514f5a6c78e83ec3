// Dynamic loss scaling for fp16 training over sharded gradients (FSDP1's ShardedGradScaler,
// with torch.amp.GradScaler's arithmetic).
//
// fp16 has 10 mantissa bits and a smallest normal of 6e-5, so small gradients flush to zero in
// an fp16 backward. The scaler multiplies the loss by a large factor S before backward, so the
// gradients are S times larger in fp16, then divides the sharded (fp32) gradients by S before
// the optimizer sees them. When S is too large, some gradient overflows to inf (or becomes
// nan): every rank then skips the optimizer step and S is multiplied by backoff_factor; after
// growth_interval steps in a row without overflow S is multiplied by growth_factor.
//
//   fsdp::ShardedGradScaler scaler(mesh);
//   scaler.scale(loss).backward();          // each micro-batch's loss
//   scaler.unscale_(optimizer);             // once per step: before clipping, which must see
//   fsdp::clip_grad_norm_(params, 1.0, mesh);  //   unscaled gradients
//   scaler.step(optimizer);                 // skipped on every rank if any rank overflowed
//   scaler.update();
//
// Each rank checks only its own gradient shards; the found-inf flag is summed over every rank
// of the mesh (the shard group, then the replicate group under HSDP), so all ranks agree on
// whether to step, and their scales stay equal.
#pragma once

#include <fsdp/device_mesh.h>

#include <ATen/core/Tensor.h>
#include <torch/arg.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace fsdp {

// torch.amp.GradScaler's hyper-parameters, with its defaults.
struct GradScalerOptions {
  // The scale of the first step. (optional) defaults to 2^16.
  TORCH_ARG(double, init_scale) = 65536.0;
  // Multiplies the scale after growth_interval steps in a row without overflow; > 1.
  // (optional) defaults to 2.
  TORCH_ARG(double, growth_factor) = 2.0;
  // Multiplies the scale after a step that overflowed; in (0, 1). (optional) defaults to 0.5.
  TORCH_ARG(double, backoff_factor) = 0.5;
  // Steps without overflow before the scale grows; >= 1. (optional) defaults to 2000.
  TORCH_ARG(int64_t, growth_interval) = 2000;
};

// What a checkpoint keeps of a scaler: torch.amp.GradScaler.state_dict()'s entries.
struct GradScalerState {
  double scale = 65536.0;      // the current scale (a float32 value)
  int64_t growth_tracker = 0;  // steps without overflow since the scale last changed
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

class ShardedGradScaler {
 public:
  // mesh: the ranks whose gradient shards are checked together; nullopt for one process.
  // Throws naming the option if options are out of range.
  explicit ShardedGradScaler(std::optional<DeviceMesh> mesh, const GradScalerOptions& options = {});

  // loss times the scale (a float32 scalar; type promotion as torch.amp.GradScaler.scale).
  at::Tensor scale(const at::Tensor& loss) const;

  // Divides the gradient of every parameter of optimizer (this rank's shards) by the scale and
  // checks them for inf and nan; collective over the mesh, and over the tensor-parallel group of
  // any parameter parallelize_module split (each rank of it holds another slice). Returns
  // whether any rank found one.
  // Once per step, after the last backward. Throws if called twice before update().
  bool unscale_(torch::optim::Optimizer& optimizer);

  // Steps optimizer unless a rank found inf or nan (unscaling first if unscale_ was not
  // called). Returns whether it stepped. Collective when it has to unscale.
  bool step(torch::optim::Optimizer& optimizer);

  // Backs the scale off after an overflow, else grows it after growth_interval good steps in
  // a row (torch._amp_update_scale_: a growth that would overflow float32 is not taken). Ends
  // the step: the next one may unscale again. Throws if the step was never unscaled.
  void update();

  // Whether the step being finished found inf or nan (after unscale_); false before.
  bool found_inf() const { return found_inf_.value_or(false); }
  double get_scale() const;
  int64_t growth_tracker() const;

  GradScalerState state() const;
  // Replaces the scale, growth tracker and hyper-parameters, as
  // torch.amp.GradScaler.load_state_dict. Throws naming a value out of range. Not between
  // unscale_ and update.
  void load_state(const GradScalerState& state);

 private:
  bool all_ranks_found_inf(at::Tensor found_inf,
                           const std::vector<ProcessGroup*>& tensor_parallel_groups) const;

  std::optional<DeviceMesh> mesh_;
  GradScalerOptions options_;
  at::Tensor scale_;               // float32, 0-D
  at::Tensor growth_tracker_;      // int32, 0-D
  std::optional<bool> found_inf_;  // set by unscale_, cleared by update
  bool stepped_ = false;
};

}  // namespace fsdp
