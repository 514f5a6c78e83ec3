// Activation checkpointing as a custom autograd function (the "reentrant" scheme of
// torch.utils.checkpoint; the non-reentrant one needs saved-tensor hooks, which LibTorch only
// exposes to Python).
//
// Invariants:
// - Forward runs the function with grad mode off, so autograd records one node for the whole
//   region and saves only its inputs (plus, with preserve_rng_state, a generator state).
// - The node always exists when grad mode is on: a 0-element leaf that requires grad is passed
//   along with the inputs, so parameters used inside the region get gradients even when no
//   input requires grad (the block after a frozen embedding, say).
// - Backward re-runs the function on detached copies of the inputs with grad mode on and runs a
//   nested backward from the recomputed outputs with the incoming gradients. Parameters are
//   leaves of that nested graph, so their gradients accumulate through AccumulateGrad exactly
//   as without checkpointing; the inputs' gradients are read off the detached copies and
//   returned. The recomputed graph is freed when the nested backward returns.
#include <ATen/ATen.h>
#include <ATen/core/Generator.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <fsdp/activation_checkpoint.h>
#include <torch/autograd.h>

#include <mutex>
#include <optional>

namespace fsdp {
namespace {

struct CheckpointState : torch::CustomClassHolder {
  ActivationCheckpointFn fn;
  // Autograd takes defined tensors only: the function's i-th input is the k-th tensor handed to
  // autograd if defined[i], else undefined.
  std::vector<bool> defined;
  ActivationCheckpointOptions options;
  std::optional<at::Generator> generator;  // the generator whose state was saved
  at::Tensor rng_state;                    // its state before forward
};

std::optional<at::Generator> default_generator_for(const std::vector<at::Tensor>& inputs) {
  c10::Device device(c10::kCPU);
  for (const auto& t : inputs) {
    if (t.defined()) {
      device = t.device();
      break;
    }
  }
  if (device.is_meta()) return std::nullopt;
  return at::globalContext().defaultGenerator(device);
}

// The function's inputs: the tensors autograd saw, with undefined ones put back in place.
std::vector<at::Tensor> with_undefined(const CheckpointState& state,
                                       const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> inputs;
  inputs.reserve(state.defined.size());
  size_t next = 0;
  for (bool d : state.defined) inputs.push_back(d ? tensors[next++] : at::Tensor());
  return inputs;
}

// Puts the saved generator state in place for the recompute and restores the generator's
// current state afterwards, so the random stream outside the region is not replayed.
class RngReplay {
 public:
  explicit RngReplay(const CheckpointState& state) {
    if (!state.generator.has_value() || !state.rng_state.defined()) return;
    generator_ = state.generator;
    std::lock_guard<std::mutex> lock(generator_->mutex());
    current_ = generator_->get_state();
    generator_->set_state(state.rng_state);
  }
  ~RngReplay() {
    if (!generator_.has_value()) return;
    std::lock_guard<std::mutex> lock(generator_->mutex());
    generator_->set_state(current_);
  }
  RngReplay(const RngReplay&) = delete;
  RngReplay& operator=(const RngReplay&) = delete;

 private:
  std::optional<at::Generator> generator_;
  at::Tensor current_;
};

struct CheckpointFunction : public torch::autograd::Function<CheckpointFunction> {
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const c10::intrusive_ptr<CheckpointState>& state,
                                                const at::Tensor& /*anchor*/,
                                                at::TensorList inputs) {
    ctx->save_for_backward(inputs.vec());
    ctx->saved_data["state"] = c10::IValue::make_capsule(state);
    at::NoGradGuard no_grad;
    return state->fn(with_undefined(*state, inputs.vec()));
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad_outputs) {
    auto state =
        c10::static_intrusive_pointer_cast<CheckpointState>(ctx->saved_data["state"].toCapsule());
    const std::vector<at::Tensor> saved = ctx->get_saved_variables();
    std::vector<at::Tensor> detached;
    detached.reserve(saved.size());
    for (const auto& x : saved) detached.push_back(x.detach().requires_grad_(x.requires_grad()));
    std::vector<at::Tensor> outputs;
    {
      RngReplay replay(*state);
      at::AutoGradMode grad_on(true);
      outputs = state->fn(with_undefined(*state, detached));
    }
    TORCH_CHECK(outputs.size() == grad_outputs.size(),
                "fsdp::activation_checkpoint: the recompute returned ", outputs.size(),
                " outputs, forward returned ", grad_outputs.size());
    std::vector<at::Tensor> roots;
    std::vector<at::Tensor> root_grads;
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].defined() && outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(outputs[i]);
        root_grads.push_back(grad_outputs[i]);
      }
    }
    if (!roots.empty()) {
      torch::autograd::backward(roots, root_grads, /*retain_graph=*/false, /*create_graph=*/false);
    }
    // One gradient per forward argument: none for the state and the anchor.
    torch::autograd::variable_list grads{at::Tensor(), at::Tensor()};
    for (const auto& x : detached) {
      grads.push_back(x.requires_grad() ? x.grad() : at::Tensor());
    }
    return grads;
  }
};

}  // namespace

std::vector<at::Tensor> activation_checkpoint(const ActivationCheckpointFn& fn,
                                              const std::vector<at::Tensor>& inputs,
                                              const ActivationCheckpointOptions& options) {
  TORCH_CHECK(fn, "fsdp::activation_checkpoint: the function is empty");
  if (!at::GradMode::is_enabled()) return fn(inputs);
  auto state = c10::make_intrusive<CheckpointState>();
  state->fn = fn;
  state->options = options;
  std::vector<at::Tensor> defined;
  for (const auto& t : inputs) {
    state->defined.push_back(t.defined());
    if (t.defined()) defined.push_back(t);
  }
  if (options.preserve_rng_state()) {
    state->generator = default_generator_for(defined);
    if (state->generator.has_value()) {
      std::lock_guard<std::mutex> lock(state->generator->mutex());
      state->rng_state = state->generator->get_state();
    }
  }
  // A 0-element leaf that requires grad: autograd builds the node even if no input needs grad.
  const at::Tensor anchor =
      at::empty({0}, at::TensorOptions().dtype(at::kFloat)).requires_grad_(true);
  return CheckpointFunction::apply(state, anchor, at::TensorList(defined));
}

at::Tensor activation_checkpoint(const std::function<at::Tensor(const at::Tensor&)>& fn,
                                 const at::Tensor& input,
                                 const ActivationCheckpointOptions& options) {
  TORCH_CHECK(fn, "fsdp::activation_checkpoint: the function is empty");
  std::vector<at::Tensor> outputs = activation_checkpoint(
      [fn](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{fn(in[0])}; },
      {input}, options);
  return outputs[0];
}

}  // namespace fsdp
