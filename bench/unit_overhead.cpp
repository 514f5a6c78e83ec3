// Per-unit overhead of the FSDP runtime: a model of many tiny units (Linear(dim, dim) then
// LayerNorm, each one FSDP unit), timed per training step. bench/unit_overhead.sh runs it
// beside PyTorch FSDP2 on the same model (bench/reference/unit_overhead.py) and reports
// (step time - the same model's step without FSDP) / units.
//
//   unit-overhead [--units 64] [--dim 64] [--batch 8] [--steps 60] [--no-fsdp]
//
// Without --no-fsdp it is one rank of a group launched by torchrun (or, with no launcher
// variables, a group of one). Rank 0 prints one JSON line: {"side": "ours", "fsdp": bool,
// "world": W, "units": N, "median_step_us": ...}, the median over the steps after the first 10.
#include <fsdp/comm/rendezvous.h>
#include <fsdp/fully_shard.h>

#include <ATen/Parallel.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/optim/sgd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace {

struct UnitImpl : torch::nn::Module {
  explicit UnitImpl(int64_t dim)
      : fc(register_module("fc", torch::nn::Linear(dim, dim))),
        norm(register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))) {}
  at::Tensor forward(const at::Tensor& x) { return norm->forward(fc->forward(x)); }
  torch::nn::Linear fc;
  torch::nn::LayerNorm norm;
};
TORCH_MODULE(Unit);

struct StackImpl : torch::nn::Module {
  StackImpl(int units, int64_t dim) {
    for (int i = 0; i < units; ++i) {
      layers.push_back(register_module("u" + std::to_string(i), Unit(dim)));
    }
  }
  at::Tensor forward(at::Tensor x) {
    for (auto& unit : layers) x = fsdp::forward(unit, x);  // a plain call when not sharded
    return x;
  }
  std::vector<Unit> layers;
};
TORCH_MODULE(Stack);

struct Options {
  int units = 64;
  int64_t dim = 64, batch = 8;
  int steps = 60;
  bool no_fsdp = false;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"unit-overhead: step time of a model of many tiny FSDP units"};
  Options o;
  app.add_option("--units", o.units, "FSDP units")->check(CLI::Range(1, 1 << 20));
  app.add_option("--dim", o.dim, "Width of each unit")->check(CLI::Range(1, 1 << 16));
  app.add_option("--batch", o.batch, "Rows per step")->check(CLI::Range(1, 1 << 20));
  app.add_option("--steps", o.steps, "Steps; the first 10 are not timed")
      ->check(CLI::Range(11, 1 << 20));
  app.add_flag("--no-fsdp", o.no_fsdp, "The same model without FSDP, one process");
  CLI11_PARSE(app, argc, argv);
  at::set_num_threads(1);  // one intra-op thread per rank, as the FSDP2 side
  std::shared_ptr<fsdp::ProcessGroup> group;
  if (!o.no_fsdp) {
    fsdp::LaunchEnv env;  // a group of one unless a launcher says otherwise
    if (fsdp::launched_by_a_launcher()) env = fsdp::launch_env_from_environment();
    fsdp::ProcessGroupOptions options;
    options.backend = fsdp::default_backend(env);  // mpi under mpirun, else gloo
    group = fsdp::init_process_group(env, options);
  }
  torch::manual_seed(0);
  Stack model(o.units, o.dim);
  if (group) {
    fsdp::DeviceMesh mesh(group);
    for (auto& unit : model->layers) fsdp::fully_shard(unit, mesh);
    fsdp::fully_shard(model, mesh);
  }
  auto params = fsdp::unique_parameters(*model);
  torch::optim::SGD optimizer(params, torch::optim::SGDOptions(1e-3));
  torch::manual_seed(1 + (group ? group->rank() : 0));
  const at::Tensor x = torch::randn({o.batch, o.dim}), y = torch::randn({o.batch, o.dim});
  std::vector<double> step_us;
  for (int step = 0; step < o.steps; ++step) {
    const auto start = std::chrono::steady_clock::now();
    optimizer.zero_grad();
    torch::nn::functional::mse_loss(fsdp::forward(model, x), y).backward();
    optimizer.step();
    step_us.push_back(
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count());
  }
  std::vector<double> timed(step_us.begin() + 10, step_us.end());
  std::nth_element(timed.begin(), timed.begin() + timed.size() / 2, timed.end());
  if (!group || group->rank() == 0) {
    std::printf(
        "{\"side\": \"%s\", \"fsdp\": %s, \"world\": %d, \"units\": %d, \"median_step_us\": "
        "%.1f}\n",
        group && group->backend_name() == "mpi" ? "ours-mpi" : "ours", o.no_fsdp ? "false" : "true",
        group ? group->size() : 1, o.units, timed[timed.size() / 2]);
  }
  return 0;
}
