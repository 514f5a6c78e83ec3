// fsdp::forward(module, args...): the call-site wrapper that stands in for forward hooks,
// which LibTorch modules do not have. See include/fsdp/fully_shard.h.
#pragma once

#include <fsdp/detail/forward_impl.h>

namespace fsdp {

// Like forward below, but computes fn(args...) in place of module->forward(args...), with the
// same FSDP logic around it: for call sites that compute with a module's parameters
// themselves (at::linear on a Linear's weight and bias). fn must read the parameters through
// module when it runs, not hold tensors taken before the call: FSDP swaps their data.
template <typename ModuleHolder, typename Fn, typename... Args>
auto forward_with(ModuleHolder& module, Fn&& fn, Args&&... args) {
  detail::ParamGroup* group = detail::param_group_of(*module);
  if (group == nullptr) {
    return fn(std::forward<Args>(args)...);
  }
  detail::ForwardScope scope(*group);
  std::vector<at::Tensor> inputs;
  (detail::collect_tensor(inputs, args), ...);
  inputs = scope.pre_forward(std::move(inputs));
  auto output = detail::call_with_substituted_tensors(fn, inputs, std::forward<Args>(args)...);
  return scope.post_forward(std::move(output));
}

// Calls module->forward(args...) with FSDP's pre-forward and post-forward logic around it
// when module is sharded, and plainly otherwise. Tensor arguments (at::Tensor, passed by
// value or reference) are routed through the post-backward hook; the result may be a tensor,
// a std::vector of tensors or a std::tuple of them (others pass through untouched).
template <typename ModuleHolder, typename... Args>
auto forward(ModuleHolder& module, Args&&... args) {
  return forward_with(
      module, [&](auto&&... a) { return module->forward(std::forward<decltype(a)>(a)...); },
      std::forward<Args>(args)...);
}

}  // namespace fsdp
