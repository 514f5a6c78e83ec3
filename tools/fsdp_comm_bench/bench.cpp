// fsdp-comm-bench's measurements (see bench.h).
//
// Invariants:
// - Every rank runs the same sequence of collectives (sizes and iteration counts are agreed
//   through a collective before each size), so the benchmark itself cannot desynchronize.
// - A reported time is the slowest rank's median over the timed calls: a collective ends for
//   the job when its last rank is done, and the median resists a descheduled iteration on a
//   loaded machine.
#include "bench.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <string>
#include <vector>

namespace fsdp::tools {
namespace {

using Clock = std::chrono::steady_clock;

const std::map<Collective, std::string>& names() {
  static const std::map<Collective, std::string> kNames = {
      {Collective::kAllGather, "all_gather"},
      {Collective::kReduceScatter, "reduce_scatter"},
      {Collective::kReduceScatterViaAllReduce, "reduce_scatter_c10d"},
      {Collective::kAllReduce, "all_reduce"},
      {Collective::kBroadcast, "broadcast"},
      {Collective::kReduce, "reduce"}};
  return kNames;
}

// The slowest rank's value of x.
double max_over_ranks(ProcessGroup& group, double x) {
  const at::Tensor mine = at::full({1}, x, at::TensorOptions(group.device()).dtype(at::kDouble));
  const at::Tensor all = at::empty({group.size()}, mine.options());
  group.all_gather_into_tensor(all, mine)->wait();
  return all.max().item<double>();
}

// The buffers of one collective at one size, and a call that issues it.
struct Call {
  at::Tensor input, output;
  Collective collective;

  void run(ProcessGroup& group) const {
    switch (collective) {
      case Collective::kAllGather:
        group.all_gather_into_tensor(output, input)->wait();
        break;
      case Collective::kReduceScatter:
        group.reduce_scatter_tensor(output, input, ReduceOp::kSum)->wait();
        break;
      case Collective::kReduceScatterViaAllReduce:
        group.all_reduce(input, ReduceOp::kSum)->wait();
        output.copy_(input.chunk(group.size())[group.rank()]);
        break;
      case Collective::kAllReduce:
        group.all_reduce(input, ReduceOp::kSum)->wait();
        break;
      case Collective::kBroadcast:
        group.broadcast(input, 0)->wait();
        break;
      case Collective::kReduce:
        group.reduce(input, 0, ReduceOp::kSum)->wait();
        break;
    }
  }
};

// Buffers for nccl-tests' size `bytes`, rounded down to whole elements per rank, on the group's
// device (the nccl backend's are CUDA tensors).
Call make_call(Collective c, int64_t bytes, int world, at::ScalarType dtype, c10::Device device) {
  const int64_t item = c10::elementSize(dtype);
  const int64_t per_rank = std::max<int64_t>(1, bytes / item / world);
  const auto options = at::TensorOptions(device).dtype(dtype);
  switch (c) {
    case Collective::kAllGather:
      return {at::ones({per_rank}, options), at::empty({per_rank * world}, options), c};
    case Collective::kReduceScatter:
    case Collective::kReduceScatterViaAllReduce:
      return {at::ones({per_rank * world}, options), at::empty({per_rank}, options), c};
    case Collective::kAllReduce:
    case Collective::kBroadcast:
    case Collective::kReduce:
      return {at::ones({per_rank * world}, options), at::Tensor(), c};
  }
  TORCH_INTERNAL_ASSERT(false, "unknown collective");
}

int64_t size_of(const Call& call) {
  const at::Tensor& larger =
      call.output.defined() && call.output.numel() > call.input.numel() ? call.output : call.input;
  return larger.numel() * static_cast<int64_t>(larger.element_size());
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

Measurement measure(ProcessGroup& group, const Call& call, const BenchOptions& o) {
  for (int i = 0; i < o.warmup_iters; ++i) call.run(group);
  // One more call, timed, decides how many fit the budget; every rank takes the slowest's view.
  auto start = Clock::now();
  call.run(group);
  const double first = max_over_ranks(group, seconds_since(start));
  const int iters = std::clamp(static_cast<int>(o.time_budget_s / std::max(first, 1e-9)), 1,
                               std::max(o.iters, 1));
  std::vector<double> times;
  group.barrier()->wait();
  for (int i = 0; i < iters; ++i) {
    start = Clock::now();
    call.run(group);
    times.push_back(seconds_since(start));
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  Measurement m;
  m.collective = call.collective;
  m.size_bytes = size_of(call);
  m.iters = iters;
  m.time_s = max_over_ranks(group, times[times.size() / 2]);
  m.algbw_gbs = static_cast<double>(m.size_bytes) / m.time_s / 1e9;
  m.busbw_gbs = m.algbw_gbs * bus_factor(call.collective, group.size());
  return m;
}

}  // namespace

std::string collective_name(Collective c) { return names().at(c); }

Collective collective_from_name(const std::string& name) {
  std::string choices;
  for (const auto& [c, n] : names()) {
    if (n == name) return c;
    choices += (choices.empty() ? "" : ", ") + n;
  }
  TORCH_CHECK(false, "unknown collective '", name, "'; choose from ", choices);
}

double bus_factor(Collective c, int world_size) {
  const double w = world_size;
  switch (c) {
    case Collective::kAllGather:
    case Collective::kReduceScatter:
    case Collective::kReduceScatterViaAllReduce:
      return (w - 1) / w;
    case Collective::kAllReduce:
      return 2 * (w - 1) / w;
    case Collective::kBroadcast:
    case Collective::kReduce:
      return 1;
  }
  return 1;
}

std::vector<Measurement> run_bench(ProcessGroup& group, const BenchOptions& o) {
  TORCH_CHECK(o.min_bytes > 0 && o.max_bytes >= o.min_bytes && o.step_factor >= 2,
              "fsdp-comm-bench: sizes from ", o.min_bytes, " to ", o.max_bytes, " bytes by x",
              o.step_factor, " name no sizes");
  std::vector<Measurement> results;
  for (Collective c : o.collectives) {
    for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= o.step_factor) {
      results.push_back(
          measure(group, make_call(c, bytes, group.size(), o.dtype, group.device()), o));
    }
  }
  return results;
}

nlohmann::json fit_alpha_beta(const std::vector<Measurement>& results) {
  std::map<Collective, std::vector<const Measurement*>> by_collective;
  for (const auto& m : results) by_collective[m.collective].push_back(&m);
  nlohmann::json fits = nlohmann::json::object();
  for (const auto& [c, points] : by_collective) {
    // Least squares on relative error, sum ((alpha + beta x - y) / y)^2: weights 1 / y^2, so
    // that a 1 KiB point counts as much as a 256 MiB one (plain least squares would fit the
    // largest sizes and leave the latency, alpha, to chance).
    double sw = 0, mx = 0, my = 0;
    for (const auto* m : points) {
      const double w = 1 / (m->time_s * m->time_s);
      sw += w, mx += w * m->size_bytes, my += w * m->time_s;
    }
    mx /= sw, my /= sw;
    double sxy = 0, sxx = 0;
    for (const auto* m : points) {
      const double w = 1 / (m->time_s * m->time_s), dx = m->size_bytes - mx;
      sxy += w * dx * (m->time_s - my), sxx += w * dx * dx;
    }
    const double beta = sxx > 0 ? sxy / sxx : 0;
    const double alpha = my - beta * mx;
    double worst = 0;
    nlohmann::json measured = nlohmann::json::array();
    for (const auto* m : points) {
      const double predicted = alpha + beta * m->size_bytes;
      worst = std::max(worst, std::abs(predicted - m->time_s) / m->time_s);
      measured.push_back({m->size_bytes, m->time_s});
    }
    // The points too: fsdp-plan reads a time off them where the line bends ([Note: a
    // collective's measured points], src/estimate/step_time_plan.cpp).
    fits[collective_name(c)] = {{"alpha_s", alpha},
                                {"beta_s_per_byte", beta},
                                {"points", points.size()},
                                {"max_rel_error", worst},
                                {"measured", measured}};
  }
  return fits;
}

std::string format_table(const std::vector<Measurement>& results, int world_size) {
  std::string out =
      fmt::format("# world size {}; time: the slowest rank's median per call\n", world_size);
  out += fmt::format("# {:>20} {:>12} {:>6} {:>12} {:>10} {:>10}\n", "collective", "size (B)",
                     "iters", "time (us)", "algbw GB/s", "busbw GB/s");
  for (const auto& m : results) {
    out += fmt::format("  {:>20} {:>12} {:>6} {:>12.1f} {:>10.3f} {:>10.3f}\n",
                       collective_name(m.collective), m.size_bytes, m.iters, m.time_s * 1e6,
                       m.algbw_gbs, m.busbw_gbs);
  }
  return out;
}

}  // namespace fsdp::tools
