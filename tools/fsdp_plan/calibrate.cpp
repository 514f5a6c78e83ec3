// Calibration of this machine for the planner. Every rate is measured on one intra-op thread
// (the setting fsdp-train gives each of two or more local ranks) and scaled to the host by its
// core count, since the planner divides the host's rates among the ranks that share it. The
// peak is the best matmul rate measured, so the calibrated MFU is relative to what LibTorch
// achieves here, not to a datasheet. Timing: the fastest of repeated calls after a warm-up.
#include "fsdp_plan/calibrate.h"

#include "fsdp_plan/compute_spec.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/optim/adamw.h>

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

namespace fsdp::tools {
namespace {

using fsdp::ForwardTimes;
using fsdp::HardwareSpec;
using Clock = std::chrono::steady_clock;

// Seconds per call of fn: the fastest of as many calls as fit budget_s (at least 5), which is
// what the machine does when nothing else runs on its cores (a median still moves with a
// compiler running beside it on a 2-core machine).
double time_call(const std::function<void()>& fn, double budget_s) {
  fn();  // warm-up: allocations, kernel selection
  double best = 1e30;
  int calls = 0;
  const auto start = Clock::now();
  while (calls < 5 || std::chrono::duration<double>(Clock::now() - start).count() < budget_s) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
    if (++calls >= 200) break;
  }
  return best;
}

// FLOP/s of a linear layer's training matmuls on a [m, k] input and an [n, k] weight: forward,
// then the input's and the weight's gradients (3 x 2 m k n FLOPs; backward's transposed
// operands run slower than forward's, so the three are measured together).
double matmul_rate(int64_t m, int64_t k, int64_t n, at::ScalarType dtype, double budget_s) {
  const at::Tensor x = at::randn({m, k}).to(dtype).set_requires_grad(true);
  const at::Tensor w = at::randn({n, k}).to(dtype).set_requires_grad(true);
  const at::Tensor grad = at::randn({m, n}).to(dtype);
  const double s = time_call([&] { at::linear(x, w).backward(grad); }, budget_s);
  return 3.0 * 2.0 * m * k * n / s;
}

// Counted FLOPs per second of causal attention forward + backward (3 x 4 B T^2 d, full T x T).
double attention_rate(int64_t batch_heads, int64_t seq, int64_t head_dim, double budget_s) {
  const auto input = [&] {
    return at::randn({1, batch_heads, seq, head_dim}).set_requires_grad(true);
  };
  const at::Tensor q = input(), k = input(), v = input();
  const double s = time_call(
      [&] {
        at::Tensor out = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
        out.sum().backward();
      },
      budget_s);
  return 3.0 * 4.0 * batch_heads * seq * seq * head_dim / s;
}

// Bytes per second of the elementwise work between a block's matmuls, on tensors of an
// activation's size (2 MiB), each op allocating its output as the model's do: a product, a
// broadcast product (norm weights, rotary tables), SiLU, and a squared mean (norm statistics).
double elementwise_bandwidth(double budget_s) {
  const at::Tensor a = at::randn({2048, 256}), b = at::randn({2048, 256}), w = at::randn({256});
  const double bytes = 3.0 * a.nbytes() + 2.0 * a.nbytes() + 2.0 * a.nbytes() + 1.0 * a.nbytes();
  return bytes / time_call(
                     [&] {
                       at::mul(a, b);
                       at::mul(a, w);
                       at::silu(a);
                       a.pow(2).mean(-1, /*keepdim=*/true);
                     },
                     budget_s);
}

double adamw_s_per_param(double budget_s) {
  const int64_t numel = 1 << 21;
  at::Tensor p = at::randn({numel}).set_requires_grad(true);
  p.mutable_grad() = at::randn({numel});
  torch::optim::AdamW adamw({p}, torch::optim::AdamWOptions(1e-3));
  return time_call([&] { adamw.step(); }, budget_s) / numel;
}

// Seconds of one forward and backward of the model `name` with the given sizes, 2 sequences of
// 128 tokens, on this thread.
double model_step_s(const models::ModelSpec& spec, double budget_s) {
  const auto model = spec.build(models::BuildOptions().seed(0));
  const at::Tensor idx = at::randint(spec.vocab_size(), {2, 128}, at::kLong);
  return time_call(
      [&] {
        for (auto& p : model->root()->parameters()) p.mutable_grad() = at::Tensor();
        model->loss(model->forward(idx), idx).backward();
      },
      budget_s);
}

// The rate of the work outside matmuls and attention (norms, rotary embeddings, activations,
// residual adds, the loss), in the planner's accounting of it (compute_spec.h: bytes over
// memory_bandwidth): one forward and backward of a GPT-2 and a Llama of two blocks at a width
// (512) the validation runs do not use, less what the calibrated matmul and attention rates
// account for. Returns the bandwidth that makes the planner's other-work time match, summed
// over the two models; hw_json is the hardware file so far (its memory_bandwidth a first guess).
double other_work_bandwidth(nlohmann::json hw_json, int cores, double budget_s) {
  const HardwareSpec hw = HardwareSpec::from_json(hw_json.dump(), "calibration");
  models::SizeOverrides sizes;
  sizes.dim = 512;
  sizes.n_layers = 2;
  sizes.n_heads = 16;  // llama-debug has 16 key-value heads
  double modelled = 0, measured = 0;
  for (const char* name : {"small", "llama-debug"}) {
    const auto spec = models::model_spec(name)->with_overrides(sizes);
    const ForwardTimes t =
        forward_times(compute_spec(*spec, 2, 128, at::kFloat), hw, at::kFloat, cores);
    modelled += t.other_s;
    measured += std::max(0.0, model_step_s(*spec, budget_s) / 3 - t.matmul_s - t.attention_s);
  }
  const double guess = hw.memory_bandwidth;
  return measured > 0 ? guess * modelled / measured : guess;
}

std::string run_output(const std::string& command) {
  std::string out;
  FILE* pipe = ::popen(command.c_str(), "r");
  TORCH_CHECK(pipe != nullptr, "fsdp-plan --calibrate: cannot run '", command, "'");
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  const int status = ::pclose(pipe);
  TORCH_CHECK(status == 0, "fsdp-plan --calibrate: '", command, "' failed (status ", status, "):\n",
              out);
  return out;
}

// fsdp-comm-bench's fits at world size w, over the sizes FSDP's collectives have here.
nlohmann::json comm_fits(const std::string& bench, int w) {
  char path[] = "/tmp/fsdp-plan-comm-XXXXXX";
  const int fd = ::mkstemp(path);
  TORCH_CHECK(fd >= 0, "fsdp-plan --calibrate: cannot create a temporary file");
  ::close(fd);
  run_output(bench + " --nproc " + std::to_string(w) +
             " --collectives all_gather,reduce_scatter,all_reduce --min-bytes 4K --max-bytes 64M"
             " --iters 5 --warmup 1 --time-budget-s 0.5 --output " +
             path + " 2>&1");
  std::ifstream in(path);
  nlohmann::json out = nlohmann::json::parse(in);
  std::remove(path);
  return out.at("fit");
}

int64_t total_memory_bytes() {
  return static_cast<int64_t>(::sysconf(_SC_PHYS_PAGES)) * ::sysconf(_SC_PAGE_SIZE);
}

nlohmann::json compute_section(int cores, double budget_s, double& peak_per_core) {
  // Matmuls of a [512, n] x [n, n] shape family, then a large one: the best rate is the peak.
  std::vector<std::pair<double, double>> points;
  for (int64_t n : {32, 64, 128, 256, 512, 1024}) {
    points.emplace_back(2.0 * 512 * n * n, matmul_rate(512, n, n, at::kFloat, budget_s));
  }
  points.emplace_back(2.0 * 2048 * 2048 * 2048,
                      matmul_rate(2048, 2048, 2048, at::kFloat, budget_s));
  peak_per_core = 0;
  for (const auto& [flops, rate] : points) peak_per_core = std::max(peak_per_core, rate);
  nlohmann::json matmul = nlohmann::json::array();
  for (const auto& [flops, rate] : points) {
    matmul.push_back({{"flops", flops}, {"fraction", rate / peak_per_core}});
  }
  nlohmann::json attention = nlohmann::json::array();
  for (int64_t head_dim : {16, 32, 64, 128}) {
    const double rate = attention_rate(1536 / head_dim, 128, head_dim, budget_s);
    attention.push_back({{"head_dim", head_dim}, {"fraction", rate / peak_per_core}});
  }
  const double bf16 = matmul_rate(1024, 1024, 1024, at::kBFloat16, budget_s);
  // All cores against one, on a matmul of a transformer block's size: the better of two
  // alternating tries of each, so that a passing load on one core does not decide it.
  double one = 0, all = 0;
  for (int round = 0; round < 2; ++round) {
    one = std::max(one, matmul_rate(1024, 384, 1536, at::kFloat, budget_s));
    at::set_num_threads(cores);
    all = std::max(all, matmul_rate(1024, 384, 1536, at::kFloat, budget_s));
    at::set_num_threads(1);
  }
  return {{"peak_flops", {{"fp32", peak_per_core * cores}, {"bf16", bf16 * cores}}},
          {"matmul_fraction", 1.0},
          {"matmul_curve", matmul},
          {"attention_curve", attention},
          {"parallel_efficiency", std::min(1.0, all / (one * cores))}};
}

}  // namespace

nlohmann::json calibrate(const CalibrateOptions& o) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int saved_threads = at::get_num_threads();
  at::set_num_threads(1);
  double peak_per_core = 0;
  nlohmann::json hw = {
      {"name", "this machine (fsdp-plan --calibrate)"},
      {"notes",
       "Measured by fsdp-plan --calibrate with LibTorch on one intra-op thread and scaled by "
       "cpu_cores. peak_flops is the best rate of a linear layer's forward and backward "
       "matmuls (so matmul_fraction is 1 and MFU is relative to it); the curves give each "
       "matmul size's and head size's fraction of it. memory_bandwidth is the rate of the work "
       "outside matmuls and attention in the planner's accounting, from a forward and backward "
       "of a 2-block GPT-2 and Llama of width 512 less their matmuls and attention; "
       "elementwise_bandwidth (not used) is a plain elementwise mix's. collectives are "
       "fsdp-comm-bench's fits at each world size, links.intra_node the 2-rank all-gather's. "
       "comm_cpu_fraction 1 is an assumption: loopback transfers are copies by the CPU."},
      {"memory_bytes", total_memory_bytes()},
      {"devices_per_node", 1},
      {"cpu_cores", cores}};
  hw["compute"] = compute_section(cores, o.seconds_per_point, peak_per_core);
  hw["memory_bandwidth"] = elementwise_bandwidth(o.seconds_per_point) * cores;
  hw["elementwise_bandwidth"] = hw["memory_bandwidth"];
  hw["adamw_s_per_param"] = adamw_s_per_param(o.seconds_per_point) / cores;
  hw["links"]["intra_node"] = {{"alpha_s", 0.0}, {"beta_s_per_byte", 0.0}};
  hw["memory_bandwidth"] = other_work_bandwidth(hw, cores, o.seconds_per_point);
  at::set_num_threads(saved_threads);

  // Not measured: loopback transfers are CPU copies, taken to occupy a core for their duration.
  hw["comm_cpu_fraction"] = 1.0;
  hw["collectives"] = nlohmann::json::object();
  for (int w : o.world_sizes) hw["collectives"][std::to_string(w)] = comm_fits(o.comm_bench, w);
  // The link: a 2-rank all-gather is one step of a ring, sending half its output.
  const nlohmann::json& ag = hw["collectives"].value("2", nlohmann::json::object());
  if (ag.contains("all_gather")) {
    hw["links"]["intra_node"] = {
        {"alpha_s", ag["all_gather"]["alpha_s"]},
        {"beta_s_per_byte", 2 * ag["all_gather"]["beta_s_per_byte"].get<double>()}};
  }
  return hw;
}

}  // namespace fsdp::tools
