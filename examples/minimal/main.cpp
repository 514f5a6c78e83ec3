// A complete FSDP training program against the installed fsdp package: a stack of MLP blocks,
// each block one FSDP unit, trained on a fixed regression target. Launch with torchrun:
//   torchrun --nproc-per-node 2 --no-python ./fsdp_minimal
#include <fsdp/clip_grad.h>
#include <fsdp/comm/rendezvous.h>
#include <fsdp/fully_shard.h>

#include <torch/torch.h>

#include <cstdio>

struct BlockImpl : torch::nn::Module {
  BlockImpl() : fc(register_module("fc", torch::nn::Linear(64, 64))) {}
  at::Tensor forward(const at::Tensor& x) { return x + torch::tanh(fc->forward(x)); }
  torch::nn::Linear fc;
};
TORCH_MODULE(Block);

struct NetImpl : torch::nn::Module {
  NetImpl() {
    for (int i = 0; i < 4; ++i) blocks.push_back(register_module("b" + std::to_string(i), Block()));
  }
  at::Tensor forward(at::Tensor x) {
    for (auto& block : blocks) x = fsdp::forward(block, x);  // the one-line change per call site
    return x;
  }
  std::vector<Block> blocks;
};
TORCH_MODULE(Net);

int main() {
  auto group = fsdp::init_process_group(fsdp::launch_env_from_environment());
  torch::manual_seed(0);  // every rank builds the same initial weights
  Net net;
  fsdp::DeviceMesh mesh(group);
  for (auto& block : net->blocks) fsdp::fully_shard(block, mesh);  // units first
  fsdp::fully_shard(net, mesh);                                    // then the root
  auto params = fsdp::unique_parameters(*net);
  torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(1e-2));
  torch::manual_seed(1 + group->rank());  // each rank its own slice of the data
  const at::Tensor x = torch::randn({16, 64}), y = torch::sin(x);
  for (int step = 1; step <= 50; ++step) {
    optimizer.zero_grad();
    auto loss = torch::mse_loss(fsdp::forward(net, x), y);
    loss.backward();  // reduce-scatters the gradients as it goes
    fsdp::clip_grad_norm_(params, 1.0, mesh);
    optimizer.step();
    if (group->rank() == 0 && (step == 1 || step % 10 == 0))
      std::printf("step %d loss %.4f (rank 0's slice)\n", step, loss.item<float>());
  }
  return 0;
}
