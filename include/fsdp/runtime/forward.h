// fsdp::forward(module, args...): the call-site wrapper that stands in for forward hooks,
// which LibTorch modules do not have. See include/fsdp/fully_shard.h.
#pragma once

#include <fsdp/detail/forward_impl.h>

namespace fsdp {

// Calls module->forward(args...) with FSDP's pre-forward and post-forward logic around it
// when module is sharded, and plainly otherwise. Tensor arguments (at::Tensor, passed by
// value or reference) are routed through the post-backward hook; the result may be a tensor,
// a std::vector of tensors or a std::tuple of them (others pass through untouched).
template <typename ModuleHolder, typename... Args>
auto forward(ModuleHolder& module, Args&&... args) {
  detail::ParamGroup* group = detail::param_group_of(*module);
  if (group == nullptr) {
    return module->forward(std::forward<Args>(args)...);
  }
  detail::ForwardScope scope(*group);
  std::vector<at::Tensor> inputs;
  (detail::collect_tensor(inputs, args), ...);
  inputs = scope.pre_forward(std::move(inputs));
  auto output = detail::call_with_substituted_tensors(
      [&](auto&&... a) { return module->forward(std::forward<decltype(a)>(a)...); }, inputs,
      std::forward<Args>(args)...);
  return scope.post_forward(std::move(output));
}

}  // namespace fsdp
