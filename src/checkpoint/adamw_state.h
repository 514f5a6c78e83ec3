// torch::optim::AdamW's per-parameter state as the checkpoint formats store it, and this rank's
// CPU RNG state: what sharded.cpp and dcp_hf.cpp both save and restore beside the parameters.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/adamw.h>

#include <string>
#include <vector>

namespace fsdp::checkpoint::detail {

// The AdamW state tensors a checkpoint may hold, by the names both formats use (and
// torch.optim.AdamW uses in its state dict).
inline constexpr const char* kAdamWStates[] = {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};

// optimizer as an AdamW (nullptr for nullptr); throws for another optimizer type.
torch::optim::AdamW* as_adamw(torch::optim::Optimizer* optimizer);
// The options of the param group that holds p, or nullptr when the optimizer does not train p.
const torch::optim::AdamWOptions* options_of(torch::optim::AdamW& optimizer, const at::Tensor& p);
// p's state, or nullptr before its first step.
torch::optim::AdamWParamState* state_of(torch::optim::AdamW& optimizer, const at::Tensor& p);
// The state tensor named kind (one of kAdamWStates); undefined when the state has none.
at::Tensor state_tensor(torch::optim::AdamWParamState& s, const std::string& kind);
// The state tensors a parameter trained with these options has: exp_avg, exp_avg_sq and, with
// amsgrad, max_exp_avg_sq.
std::vector<std::string> state_kinds(const torch::optim::AdamWOptions& options);
// The AdamW state of param, created uninitialized (and its key recorded in `created`) when the
// optimizer has none yet: the loader then writes every element, padding included.
torch::optim::AdamWParamState& state_to_load(torch::optim::AdamW& adamw, const at::Tensor& param,
                                             bool amsgrad, std::vector<void*>& created);

// This process's CPU generator state, and setting it back from those bytes.
at::Tensor cpu_rng_state();
// Restores states[rank] (states[0] when there are fewer states than ranks, nothing when there
// are none); throws naming dir when this build cannot take the state.
void restore_cpu_rng_state(const std::string& dir, const std::vector<std::string>& states,
                           int rank);

}  // namespace fsdp::checkpoint::detail
