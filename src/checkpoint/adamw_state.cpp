// See adamw_state.h.
#include "checkpoint/adamw_state.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <memory>
#include <mutex>

namespace fsdp::checkpoint::detail {

torch::optim::AdamW* as_adamw(torch::optim::Optimizer* optimizer) {
  if (optimizer == nullptr) return nullptr;
  auto* adamw = dynamic_cast<torch::optim::AdamW*>(optimizer);
  TORCH_CHECK(adamw != nullptr,
              "checkpoints store the state of torch::optim::AdamW only; this optimizer is another "
              "type (pass nullptr to save or load the model alone)");
  return adamw;
}

const torch::optim::AdamWOptions* options_of(torch::optim::AdamW& optimizer, const at::Tensor& p) {
  for (auto& group : optimizer.param_groups()) {
    for (const auto& q : group.params()) {
      if (q.unsafeGetTensorImpl() == p.unsafeGetTensorImpl()) {
        return &static_cast<const torch::optim::AdamWOptions&>(group.options());
      }
    }
  }
  return nullptr;
}

torch::optim::AdamWParamState* state_of(torch::optim::AdamW& optimizer, const at::Tensor& p) {
  auto& states = optimizer.state();
  auto it = states.find(p.unsafeGetTensorImpl());
  if (it == states.end()) return nullptr;
  return static_cast<torch::optim::AdamWParamState*>(it->second.get());
}

at::Tensor state_tensor(torch::optim::AdamWParamState& s, const std::string& kind) {
  if (kind == "exp_avg") return s.exp_avg();
  if (kind == "exp_avg_sq") return s.exp_avg_sq();
  return s.max_exp_avg_sq();
}

std::vector<std::string> state_kinds(const torch::optim::AdamWOptions& options) {
  std::vector<std::string> kinds = {"exp_avg", "exp_avg_sq"};
  if (options.amsgrad()) kinds.push_back("max_exp_avg_sq");
  return kinds;
}

torch::optim::AdamWParamState& state_to_load(torch::optim::AdamW& adamw, const at::Tensor& param,
                                             bool amsgrad, std::vector<void*>& created) {
  auto& states = adamw.state();
  auto it = states.find(param.unsafeGetTensorImpl());
  if (it == states.end()) {
    at::NoGradGuard no_grad;
    const at::Tensor p = param.detach();
    auto state = std::make_unique<torch::optim::AdamWParamState>();
    state->exp_avg(at::empty_like(p, at::MemoryFormat::Contiguous));
    state->exp_avg_sq(at::empty_like(p, at::MemoryFormat::Contiguous));
    if (amsgrad) state->max_exp_avg_sq(at::empty_like(p, at::MemoryFormat::Contiguous));
    it = states.emplace(param.unsafeGetTensorImpl(), std::move(state)).first;
    created.push_back(param.unsafeGetTensorImpl());
  }
  return static_cast<torch::optim::AdamWParamState&>(*it->second);
}

at::Tensor cpu_rng_state() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

namespace {

void set_cpu_rng_state(const std::string& bytes) {
  at::Tensor state = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
  std::memcpy(state.data_ptr(), bytes.data(), bytes.size());
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

}  // namespace

void restore_cpu_rng_state(const std::string& dir, const std::vector<std::string>& states,
                           int rank) {
  if (states.empty()) return;
  const size_t r = static_cast<size_t>(rank) < states.size() ? rank : 0;
  try {
    set_cpu_rng_state(states[r]);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "checkpoint '", dir,
                "' has an RNG state this build cannot restore: ", e.what_without_backtrace());
  }
}

}  // namespace fsdp::checkpoint::detail
