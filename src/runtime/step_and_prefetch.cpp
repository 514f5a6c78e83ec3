// FSDPModule::step_and_prefetch: the optimizer step in two halves, this unit's parameters first,
// with the unit's all-gather for the next forward issued between them.
//
// [Note: an optimizer step in two halves]
// The next step's first wait is the root's all-gather, issued by the root's pre-forward; for
// GPT-2 that is the tied embedding, a third of the model, and on a 1 Gbit/s link it is the
// largest exposed collective of the step. Its shards are final as soon as the optimizer has
// written them, which need not be last: stepping the root's own parameters first and then the
// rest lets the gather run beside the larger half of the optimizer's work. torch's C++ optimizers
// skip a parameter whose gradient is undefined and update each parameter from its own gradient
// and state, so hiding the other half's gradients for one step() call and then this half's for
// a second gives the same values and state as one step() call, bit for bit; the per-parameter
// step counts advance once each. The gradients are handed back before returning (or throwing),
// so what the caller reads afterwards (norms, probes, zero_grad) is as after optimizer.step().
#include <fsdp/fully_shard.h>

#include "runtime/param_group.h"

#include <torch/optim/optimizer.h>

#include <unordered_set>
#include <utility>
#include <vector>

namespace fsdp {
namespace {

// Takes the gradients of the parameters that `keep` does not select out of the optimizer for
// the guard's lifetime, and gives them back on destruction.
class HiddenGradients {
 public:
  template <typename Keep>
  HiddenGradients(torch::optim::Optimizer& optimizer, Keep keep) {
    for (auto& group : optimizer.param_groups()) {
      for (auto& p : group.params()) {
        if (keep(p) || !p.grad().defined()) continue;
        hidden_.emplace_back(p, std::move(p.mutable_grad()));
        p.mutable_grad() = at::Tensor();
      }
    }
  }
  ~HiddenGradients() {
    for (auto& [param, grad] : hidden_) param.mutable_grad() = std::move(grad);
  }
  HiddenGradients(const HiddenGradients&) = delete;
  HiddenGradients& operator=(const HiddenGradients&) = delete;

 private:
  std::vector<std::pair<at::Tensor, at::Tensor>> hidden_;
};

}  // namespace

void FSDPModule::step_and_prefetch(torch::optim::Optimizer& optimizer) {
  TORCH_CHECK(!group_->step_in_progress(), "fsdp: step_and_prefetch on unit '", path(),
              "' while its forward or backward is running (call it after backward, in place of "
              "optimizer.step())");
  std::unordered_set<const c10::TensorImpl*> own;
  for (const auto& p : sharded_parameters()) own.insert(p.local.unsafeGetTensorImpl());
  const auto is_own = [&](const at::Tensor& p) { return own.count(p.unsafeGetTensorImpl()) > 0; };
  {
    HiddenGradients others(optimizer, is_own);
    optimizer.step();
  }
  group_->issue_unshard_for_next_step();
  HiddenGradients mine(optimizer, [&](const at::Tensor& p) { return !is_own(p); });
  optimizer.step();
}

}  // namespace fsdp
