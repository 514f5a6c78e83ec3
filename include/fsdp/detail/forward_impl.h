// Template plumbing behind fsdp::forward. Nothing here is part of the public API.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace fsdp::detail {

class ParamGroup;

// The unit state attached to module by fully_shard, or nullptr.
ParamGroup* param_group_of(const torch::nn::Module& module);

// Runs a unit's pre-forward and post-forward. If forward throws, the destructor puts the
// unit back into a consistent (sharded, idle) state so a later call does not hang.
class ForwardScope {
 public:
  explicit ForwardScope(ParamGroup& group);
  ~ForwardScope();
  ForwardScope(const ForwardScope&) = delete;
  ForwardScope& operator=(const ForwardScope&) = delete;

  // Gathers the unit's parameters; returns the tensor inputs, those that require grad routed
  // through the function whose backward triggers the unit's post-backward.
  std::vector<at::Tensor> pre_forward(std::vector<at::Tensor> inputs);

  at::Tensor post_forward(at::Tensor output) {
    std::vector<at::Tensor> outputs{std::move(output)};
    finish(outputs);
    return std::move(outputs[0]);
  }
  std::vector<at::Tensor> post_forward(std::vector<at::Tensor> outputs) {
    finish(outputs);
    return outputs;
  }
  template <typename... Ts>
  std::tuple<Ts...> post_forward(std::tuple<Ts...> outputs) {
    std::vector<at::Tensor> tensors;
    std::apply([&](auto&... o) { (collect_tensor(tensors, o), ...); }, outputs);
    finish(tensors);
    std::size_t next = 0;
    std::apply([&](auto&... o) { (replace_tensor(o, tensors, next), ...); }, outputs);
    return outputs;
  }
  template <typename T>
  T post_forward(T output) {  // outputs with no tensors
    std::vector<at::Tensor> none;
    finish(none);
    return output;
  }

  template <typename T>
  static void collect_tensor(std::vector<at::Tensor>& out, const T& value) {
    if constexpr (std::is_same_v<std::decay_t<T>, at::Tensor>) out.push_back(value);
  }
  template <typename T>
  static void replace_tensor(T& value, const std::vector<at::Tensor>& tensors, std::size_t& next) {
    if constexpr (std::is_same_v<std::decay_t<T>, at::Tensor>) value = tensors[next++];
  }

 private:
  // Registers pre-backward hooks on outputs that require grad, then reshards if configured.
  void finish(std::vector<at::Tensor>& outputs);

  ParamGroup& group_;
  bool finished_ = false;
};

template <typename T>
void collect_tensor(std::vector<at::Tensor>& out, const T& value) {
  ForwardScope::collect_tensor(out, value);
}

// Position of argument I among the tensor arguments of Args.
template <std::size_t I, typename... Args>
constexpr std::size_t tensor_ordinal() {
  constexpr bool is_tensor[] = {std::is_same_v<std::decay_t<Args>, at::Tensor>..., false};
  std::size_t n = 0;
  for (std::size_t k = 0; k < I; ++k) n += is_tensor[k] ? 1 : 0;
  return n;
}

template <std::size_t I, typename... Args, typename T>
decltype(auto) substitute(const std::vector<at::Tensor>& inputs, T&& arg) {
  if constexpr (std::is_same_v<std::decay_t<T>, at::Tensor>) {
    return inputs[tensor_ordinal<I, Args...>()];
  } else {
    return std::forward<T>(arg);
  }
}

template <typename Call, typename... Args, std::size_t... I>
auto call_substituted(Call&& call, const std::vector<at::Tensor>& inputs, std::index_sequence<I...>,
                      Args&&... args) {
  return call(substitute<I, Args...>(inputs, std::forward<Args>(args))...);
}

template <typename Call, typename... Args>
auto call_with_substituted_tensors(Call&& call, const std::vector<at::Tensor>& inputs,
                                   Args&&... args) {
  return call_substituted(std::forward<Call>(call), inputs, std::index_sequence_for<Args...>{},
                          std::forward<Args>(args)...);
}

}  // namespace fsdp::detail
