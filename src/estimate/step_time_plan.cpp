// The step-time planner (include/fsdp/step_time_plan.h): a compute clock and one serial clock per
// process group, moved by the events of the memory estimator's replay (step_replay.h).
//
// Invariants: the compute clock never goes back; a collective never starts before it is issued
// nor before the previous collective of its group ends (one progress thread per group); the
// exposed time is exactly the sum of the compute clock's jumps to a collective's end. Every rank
// runs the same schedule on the same sizes, so one rank's timeline is the step's.
#include "estimate/step_replay.h"

#include <c10/util/Exception.h>
#include <fsdp/step_time_plan.h>

#include <algorithm>
#include <cmath>
#include <deque>
#include <nlohmann/json.hpp>

namespace fsdp {
namespace {

using detail::ComputePhase;
using detail::kRootUnit;
using detail::ReductionKind;
using nlohmann::json;

// AdamW moves about this many bytes per fp32 element: reads the parameter, its gradient and two
// moments, writes the parameter and the two moments.
constexpr double kAdamWBytesPerParam = 28;

// ---- Hardware files ----

const json& field(const json& j, const char* key, const std::string& where) {
  TORCH_CHECK(j.is_object() && j.contains(key), "hardware file ", where, ": missing field '", key,
              "'");
  return j.at(key);
}

double number(const json& j, const char* key, const std::string& where, bool positive = true) {
  const json& v = field(j, key, where);
  TORCH_CHECK(v.is_number(), "hardware file ", where, ": '", key, "' must be a number, got ",
              v.dump());
  const double x = v.get<double>();
  TORCH_CHECK(std::isfinite(x) && (positive ? x > 0 : x >= 0), "hardware file ", where, ": '", key,
              "' must be ", positive ? "positive" : "non-negative", ", got ", x);
  return x;
}

double optional_number(const json& j, const char* key, const std::string& where, double dflt) {
  return j.contains(key) ? number(j, key, where, /*positive=*/false) : dflt;
}

AlphaBeta alpha_beta(const json& j, const std::string& where) {
  return {number(j, "alpha_s", where, false), number(j, "beta_s_per_byte", where, false)};
}

std::vector<std::pair<double, double>> curve(const json& j, const char* x_key,
                                             const std::string& where) {
  std::vector<std::pair<double, double>> points;
  TORCH_CHECK(j.is_array() && !j.empty(), "hardware file ", where,
              " must be a non-empty array of points");
  for (const json& p : j)
    points.emplace_back(number(p, x_key, where), number(p, "fraction", where));
  std::sort(points.begin(), points.end());
  return points;
}

void parse_compute(HardwareSpec& h, const json& c, const std::string& where) {
  const json& peak = field(c, "peak_flops", where + " compute");
  TORCH_CHECK(peak.is_object() && !peak.empty(), "hardware file ", where,
              ": compute.peak_flops must map dtypes (fp32, bf16, fp16) to FLOP/s");
  for (const auto& [dtype, v] : peak.items()) {
    h.peak_flops[dtype] = number(peak, dtype.c_str(), where + " compute.peak_flops");
  }
  h.matmul_fraction = number(c, "matmul_fraction", where + " compute");
  TORCH_CHECK(h.matmul_fraction <= 1, "hardware file ", where,
              ": compute.matmul_fraction is a fraction of the peak, at most 1, got ",
              h.matmul_fraction);
  h.attention_fraction =
      optional_number(c, "attention_fraction", where + " compute", h.matmul_fraction);
  if (c.contains("matmul_curve")) {
    h.matmul_curve = curve(c["matmul_curve"], "flops", where + " compute.matmul_curve");
  }
  if (c.contains("attention_curve")) {
    h.attention_curve = curve(c["attention_curve"], "head_dim", where + " compute.attention_curve");
  }
  h.parallel_efficiency = optional_number(c, "parallel_efficiency", where + " compute", 1);
}

// A fit of fsdp-comm-bench's: alpha_s, beta_s_per_byte and, optionally, "measured": [[bytes,
// seconds], ...].
CollectiveFit collective_fit(const json& j, const std::string& where) {
  CollectiveFit fit{alpha_beta(j, where), {}};
  if (!j.contains("measured")) return fit;
  const json& points = j["measured"];
  TORCH_CHECK(points.is_array() && !points.empty(), "hardware file ", where,
              ".measured must be a non-empty array of [bytes, seconds]");
  for (const json& p : points) {
    TORCH_CHECK(p.is_array() && p.size() == 2 && p[0].is_number() && p[1].is_number() &&
                    p[0].get<double>() > 0 && p[1].get<double>() > 0,
                "hardware file ", where, ".measured: each point must be [bytes, seconds], both ",
                "positive, got ", p.dump());
    fit.measured.emplace_back(p[0].get<double>(), p[1].get<double>());
  }
  std::sort(fit.measured.begin(), fit.measured.end());
  return fit;
}

// j[key] (optional): fsdp-comm-bench's fits by group size, then collective name.
std::map<int, std::map<std::string, CollectiveFit>> fits_by_group(const json& j,
                                                                  const std::string& key,
                                                                  const std::string& where) {
  std::map<int, std::map<std::string, CollectiveFit>> by_group;
  if (!j.contains(key)) return by_group;
  for (const auto& [size, fits] : j[key].items()) {
    int group = 0;
    try {
      group = std::stoi(size);
    } catch (const std::exception&) {
      group = 0;
    }
    TORCH_CHECK(group >= 2, "hardware file ", where, ": ", key,
                " are keyed by group size (2, 4, ...), got '", size, "'");
    for (const auto& [name, fit] : fits.items()) {
      by_group[group][name] = collective_fit(fit, where + " " + key + "." + size + "." + name);
    }
  }
  return by_group;
}

void parse_links(HardwareSpec& h, const json& j, const std::string& where) {
  const json& links = field(j, "links", where);
  h.intra_node =
      alpha_beta(field(links, "intra_node", where + " links"), where + " links.intra_node");
  h.inter_node = links.contains("inter_node")
                     ? alpha_beta(links["inter_node"], where + " links.inter_node")
                     : h.intra_node;
  h.collectives = fits_by_group(j, "collectives", where);
  h.inter_node_collectives = fits_by_group(j, "inter_node_collectives", where);
}

// ---- Compute and communication costs ----

// Linear interpolation in log(x), clamped at the ends.
double interpolate(const std::vector<std::pair<double, double>>& points, double x) {
  if (x <= points.front().first) return points.front().second;
  if (x >= points.back().first) return points.back().second;
  auto hi = std::upper_bound(points.begin(), points.end(), std::make_pair(x, 0.0));
  auto lo = hi - 1;
  const double t = std::log(x / lo->first) / std::log(hi->first / lo->first);
  return lo->second + t * (hi->second - lo->second);
}

std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return "fp32";
    case at::kBFloat16:
      return "bf16";
    case at::kHalf:
      return "fp16";
    case at::kDouble:
      return "fp64";
    default:
      return c10::toString(t);
  }
}

// What one rank gets of the device: its FLOP/s and bytes/s, given how many ranks share it.
class Device {
 public:
  Device(const HardwareSpec& h, at::ScalarType compute_dtype, int world) : h_(h) {
    const std::string name = dtype_name(compute_dtype);
    const auto it = h.peak_flops.find(name);
    TORCH_CHECK(it != h.peak_flops.end(), "hardware file '", h.name, "' gives no peak_flops for ",
                name, ", the compute dtype");
    peak_ = it->second;
    share_ = 1;
    if (h.cpu_cores > 0) {
      // fsdp-train gives each of W local ranks max(1, cores / W) intra-op threads; more ranks
      // than cores time-share them.
      const int threads = std::max(1, h.cpu_cores / world);
      const double cores = std::min<double>(threads, static_cast<double>(h.cpu_cores) / world);
      share_ = cores / h.cpu_cores * (threads > 1 ? h.parallel_efficiency : 1.0);
    }
  }
  double peak() const { return peak_; }
  double matmul_s(const Matmul& m) const {
    const double flops = 2.0 * m.m * m.k * m.n;
    const double fraction =
        h_.matmul_curve.empty() ? h_.matmul_fraction : interpolate(h_.matmul_curve, flops);
    return flops / (peak_ * fraction * share_);
  }
  double attention_s(const UnitComputeSpec& u) const {
    if (u.attention_batch_heads == 0) return 0;
    const double fraction = h_.attention_curve.empty()
                                ? h_.attention_fraction
                                : interpolate(h_.attention_curve, u.attention_head_dim);
    return attention_flops(u) / (peak_ * fraction * share_);
  }
  double bytes_s(double bytes) const { return bytes / (h_.memory_bandwidth * share_); }
  double adamw_s(int64_t numel) const {
    if (h_.adamw_s_per_param > 0) return numel * h_.adamw_s_per_param / share_;
    return bytes_s(kAdamWBytesPerParam * numel);
  }
  static double attention_flops(const UnitComputeSpec& u) {
    return 4.0 * u.attention_batch_heads * u.attention_seq * u.attention_seq * u.attention_head_dim;
  }

 private:
  const HardwareSpec& h_;
  double peak_ = 0;
  double share_ = 1;  // of the device's rates this rank gets
};

}  // namespace

// [Note: a collective's measured points]
// One alpha-beta line over 1 KiB to 64 MiB fits neither end where the curve bends: over the
// shaped link of bench/cluster, tbf's 128 KiB burst lets small messages through at memory speed
// and large ones at the wire's, and the line fitted on relative error (fsdp-comm-bench's)
// priced a 28 MB all-gather at 0.13 s that took 0.19 s, in the bench and in training alike. So
// where the file has the measured points, a size between two of them takes the straight line
// between them, a size beyond the largest takes its time per byte, and one below the smallest
// its time; the line prices only what has no points.
double CollectiveFit::seconds(double bytes) const {
  if (measured.empty()) return line.alpha_s + line.beta_s_per_byte * bytes;
  if (bytes <= measured.front().first) return measured.front().second;
  if (bytes >= measured.back().first) {
    return measured.back().second * bytes / measured.back().first;
  }
  const auto hi = std::upper_bound(measured.begin(), measured.end(), std::make_pair(bytes, 0.0));
  const auto lo = hi - 1;
  const double t = (bytes - lo->first) / (hi->first - lo->first);
  return lo->second + t * (hi->second - lo->second);
}

namespace {

// [Note: which groups cross nodes]
// Ranks fill nodes in order (ranks 0 .. devices_per_node - 1 on the first), as torchrun and
// mpirun place them, and every group is a run of ranks at a fixed stride: the tp group
// consecutive ranks, FSDP's shard group (and hpZ's piece of it) every tp-th rank, HSDP's
// replicate group every (shard size x tp)-th. A group spans nodes when the ranks from its first
// to its last do not fit in one node: group x stride of them for the tp and shard groups, the
// whole job for the replicate group (one rank from each shard group), however few ranks it has.
// Before this was written down the planner asked "group > devices_per_node" of every group,
// which put an HSDP replicate group of 2 across 2 GPU nodes of 8 on NVLink. A CPU host's file
// without inter_node_collectives describes one host that every rank of the job shares (as
// fsdp-plan --calibrate writes it), so nothing there spans nodes.
bool spans_nodes(const HardwareSpec& h, int64_t ranks_covered) {
  if (h.cpu_cores > 0 && h.inter_node_collectives.empty()) return false;
  return ranks_covered > h.devices_per_node;
}

// The measured fit for this collective and group size in fits, if there is one.
const CollectiveFit* fit_for(const std::map<int, std::map<std::string, CollectiveFit>>& fits,
                             const std::string& name, int group) {
  const auto by_size = fits.find(group);
  if (by_size == fits.end()) return nullptr;
  const auto fit = by_size->second.find(name);
  return fit == by_size->second.end() ? nullptr : &fit->second;
}

// Time of one collective of nccl-tests' size over group ranks, which span nodes or not: the
// measured fit when the file has one for this collective, group size and placement, else a ring
// over the slowest link it crosses (see HardwareSpec::inter_node_collectives for CPU hosts).
double collective_s(const HardwareSpec& h, const std::string& name, double bytes, int group,
                    bool crosses_nodes) {
  if (group <= 1) return 0;
  const CollectiveFit* fit =
      crosses_nodes ? fit_for(h.inter_node_collectives, name, group) : nullptr;
  if (!fit && (!crosses_nodes || h.cpu_cores > 0)) fit = fit_for(h.collectives, name, group);
  if (fit) return fit->seconds(bytes);
  const AlphaBeta& link = crosses_nodes ? h.inter_node : h.intra_node;
  const double passes = name == "all_reduce" ? 2.0 : 1.0;  // reduce-scatter then all-gather
  return passes * ((group - 1) * link.alpha_s +
                   (group - 1) / static_cast<double>(group) * bytes * link.beta_s_per_byte);
}

double forward_s(const Device& d, const UnitComputeSpec& u) {
  double s = d.attention_s(u) + d.bytes_s(u.other_bytes);
  for (const Matmul& m : u.matmuls) s += d.matmul_s(m);
  return s;
}

double model_flops(const UnitComputeSpec& u) {
  double f = Device::attention_flops(u);
  for (const Matmul& m : u.matmuls) f += 2.0 * m.m * m.k * m.n;
  return f;
}

// ---- The timelines ----

class Timelines : public detail::StepObserver {
 public:
  Timelines(const ModelComputeSpec& model, const StepTimeOptions& o, const HardwareSpec& h,
            const Device& device)
      : model_(model), o_(o), h_(h), d_(device) {}

  void issue_gather(int unit, int64_t output_bytes, int group_size, bool from_piece,
                    int64_t cast_bytes) override {
    busy(d_.bytes_s(2.0 * cast_bytes));  // the cast copy of the shards, made before issuing
    Lane& lane = from_piece ? piece_lane_ : shard_lane_;
    gather_end_[unit] = lane.run(t_, fsdp_collective("all_gather", output_bytes, group_size));
  }
  void wait_gather(int unit, int64_t unsharded_bytes) override {
    wait_until(gather_end_.at(unit));
    busy(d_.bytes_s(2.0 * unsharded_bytes));  // copy-out
  }
  void compute(int unit, ComputePhase phase) override { busy(compute_s(unit, phase)); }
  void issue_reduction(int unit, int64_t full_bytes, int64_t input_bytes, ReductionKind kind,
                       int group_size) override {
    busy(d_.bytes_s(full_bytes + input_bytes));  // packing the gradients
    const char* name = kind == ReductionKind::kAllReduce ? "all_reduce" : "reduce_scatter";
    reductions_.push_back(shard_lane_.run(t_, fsdp_collective(name, input_bytes, group_size)));
  }
  void finish_reduction(int unit, int64_t output_bytes, int replicas) override {
    wait_until(reductions_.front());
    reductions_.pop_front();
    if (replicas > 1) {  // HSDP: the reduced shard across replicas, waited for later
      all_reduce_end_[unit] = replicate_lane_.run(
          t_, priced("all_reduce", output_bytes, replicas, spans_nodes(h_, job_ranks())));
      return;
    }
    assign_gradients(output_bytes);
  }
  void finish_all_reduce(int unit, int64_t output_bytes) override {
    wait_until(all_reduce_end_.at(unit));
    assign_gradients(output_bytes);
  }
  void keep_gradients(int unit, int64_t bytes) override { busy(d_.bytes_s(2.0 * bytes)); }
  // [Note: tensor-parallel collectives block the compute thread]
  // A tensor-parallel layer's collective is issued and waited for inside its forward or backward
  // (the next op needs its output), so no compute hides it: the compute thread's clock moves by
  // each call's time. It runs on the tp group's own thread beside FSDP's, whose collectives go on
  // under it as under compute. fsdp-train's exposed_comm_s counts FSDP's waits only, so this
  // time is reported apart (tp_comm_s).
  void tensor_parallel(const TensorParallelBytes& traffic) override {
    auto run = [&](const char* name, const TensorParallelTraffic& t) {
      if (t.calls == 0) return;
      const double s = t.calls * tp_collective(name, double(t.bytes) / t.calls);
      t_ += s;
      tp_comm_s_ += s;
    };
    run("all_gather", traffic.all_gather);
    run("reduce_scatter", traffic.reduce_scatter);
    run("all_reduce", traffic.all_reduce);
  }
  // [Note: a lookup's collectives block the compute thread]
  // A lookup from shards waits for each of its collectives as it makes them (the embedding's
  // output needs the rows), so the compute thread's clock moves by each one's time; they run on
  // the side groups' threads, which nothing else uses, so they never queue behind FSDP's, and
  // the runtime counts their waits as exposed communication and their time in comm_s.
  void lookup(const detail::LookupCollectives& c) override {
    using Group = detail::LookupCollectives::Group;
    busy(d_.bytes_s(c.compute_bytes));
    for (const auto& call : c.calls) {
      const bool shard = call.group == Group::kShard;
      const double s =
          shard ? fsdp_collective(call.name, call.bytes, c.shard_group)
                : priced(call.name, call.bytes, c.replicas, spans_nodes(h_, job_ranks()));
      wait_until((shard ? side_shard_lane_ : side_replicate_lane_).run(t_, s));
    }
  }
  void optimizer_step(int64_t shard_numel) override {
    const double start = t_;
    const int world = o_.memory().world_size();
    if (o_.clip_grad_norm()) {
      busy(d_.bytes_s(4.0 * shard_numel));  // the norm: one read of the gradients
      if (o_.tensor_parallel() > 1) {       // the split gradients' squares, over the tp group first
        wait_until(tp_lane_.run(t_, tp_collective("all_reduce", 8)), false);
      }
      if (world > 1) {
        wait_until(shard_lane_.run(t_, fsdp_collective("all_reduce", 4, world)), false);
      }
      busy(d_.bytes_s(8.0 * shard_numel));  // scaling them in place
    }
    if (o_.all_reduce_loss() && world > 1) {
      wait_until(shard_lane_.run(t_, fsdp_collective("all_reduce", 8, world)), false);
    }
    busy(d_.adamw_s(shard_numel));
    optimizer_s_ = t_ - start;
  }

  double now() const { return t_; }
  double busy_s() const { return busy_s_; }
  double exposed_s() const { return exposed_s_; }
  double optimizer_s() const { return optimizer_s_; }
  double tp_comm_s() const { return tp_comm_s_; }
  double comm_s() const {
    return shard_lane_.busy_s + piece_lane_.busy_s + replicate_lane_.busy_s +
           side_shard_lane_.busy_s + side_replicate_lane_.busy_s;
  }
  // The part of comm_s in collectives whose group stays within a node.
  double within_node_comm_s() const { return within_node_comm_s_; }

 private:
  // Every rank of the job: the data-parallel world times the tp size.
  int64_t job_ranks() const { return int64_t{o_.memory().world_size()} * o_.tensor_parallel(); }
  // A collective of a group of FSDP's data-parallel ranks (the shard group, hpZ's piece, the
  // world), group ranks every tp-th rank ([Note: which groups cross nodes]).
  double fsdp_collective(const char* name, double bytes, int group) {
    return priced(name, bytes, group, spans_nodes(h_, int64_t{group} * o_.tensor_parallel()));
  }
  // A collective of the tp group (consecutive ranks).
  double tp_collective(const char* name, double bytes) const {
    const int tp = o_.tensor_parallel();
    return collective_s(h_, name, bytes, tp, spans_nodes(h_, tp));
  }
  // An FSDP collective's time; one within a node also counts towards within_node_comm_s.
  double priced(const char* name, double bytes, int group, bool crosses_nodes) {
    const double s = collective_s(h_, name, bytes, group, crosses_nodes);
    if (!crosses_nodes) within_node_comm_s_ += s;
    return s;
  }

  // One process group's progress thread: collectives in issue order, one at a time.
  struct Lane {
    double free_at = 0;
    double busy_s = 0;
    double run(double issued_at, double duration) {
      free_at = std::max(free_at, issued_at) + duration;
      busy_s += duration;
      return free_at;
    }
  };

  // The average, and the copy of the reduced output into the master dtype.
  void assign_gradients(int64_t output_bytes) { busy(d_.bytes_s(3.0 * output_bytes)); }
  void busy(double seconds) {
    t_ += seconds;
    busy_s_ += seconds;
  }
  // The compute thread blocks until end; counted (as exposed communication) when the runtime
  // waits, not when the trainer's own scalar all-reduces do (fsdp-train's exposed_comm_s).
  void wait_until(double end, bool counted = true) {
    if (end > t_) {
      if (counted) exposed_s_ += end - t_;
      t_ = end;
    }
  }
  const UnitComputeSpec& unit(int i) const { return model_.units.at(i); }
  double compute_s(int i, ComputePhase phase) const {
    switch (phase) {
      case ComputePhase::kRootStem:
        return forward_s(d_, model_.root_stem);
      case ComputePhase::kForward:
        return forward_s(d_, unit(i));
      case ComputePhase::kRootHead:
        return forward_s(d_, model_.root_head);
      case ComputePhase::kRootHeadBackward:
        return 2 * forward_s(d_, model_.root_head);
      case ComputePhase::kBackward:
        return (o_.activation_checkpoint() ? 3 : 2) * forward_s(d_, unit(i));
      case ComputePhase::kRootStemBackward:
        return 2 * forward_s(d_, model_.root_stem);
    }
    TORCH_INTERNAL_ASSERT(false, "unhandled compute phase");
  }

  const ModelComputeSpec& model_;
  const StepTimeOptions& o_;
  const HardwareSpec& h_;
  const Device& d_;
  double t_ = 0, busy_s_ = 0, exposed_s_ = 0, optimizer_s_ = 0, tp_comm_s_ = 0;
  double within_node_comm_s_ = 0;
  Lane shard_lane_, piece_lane_, replicate_lane_, tp_lane_;
  Lane side_shard_lane_, side_replicate_lane_;  // the mesh's side groups (a lookup's)
  std::map<int, double> gather_end_;
  std::map<int, double> all_reduce_end_;  // HSDP: when each unit's all-reduce across replicas ends
  std::deque<double> reductions_;
};

}  // namespace

double forward_flops(const ModelComputeSpec& compute) {
  double flops = model_flops(compute.root_stem) + model_flops(compute.root_head);
  for (const auto& u : compute.units) flops += model_flops(u);
  return flops;
}

ForwardTimes forward_times(const ModelComputeSpec& compute, const HardwareSpec& hardware,
                           at::ScalarType compute_dtype, int world_size) {
  const Device d(hardware, compute_dtype, world_size);
  ForwardTimes t;
  auto add = [&](const UnitComputeSpec& u) {
    for (const Matmul& m : u.matmuls) t.matmul_s += d.matmul_s(m);
    t.attention_s += d.attention_s(u);
    t.other_s += d.bytes_s(u.other_bytes);
  };
  add(compute.root_stem);
  for (const auto& u : compute.units) add(u);
  add(compute.root_head);
  return t;
}

HardwareSpec HardwareSpec::from_json(const std::string& text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    TORCH_CHECK(false, "hardware file ", origin, " is not JSON: ", e.what());
  }
  const std::string where = "'" + origin + "'";
  HardwareSpec h;
  h.name = j.value("name", origin);
  h.memory_bytes = static_cast<int64_t>(number(j, "memory_bytes", where));
  h.devices_per_node = static_cast<int>(optional_number(j, "devices_per_node", where, 1));
  TORCH_CHECK(h.devices_per_node >= 1, "hardware file ", where,
              ": devices_per_node must be at least 1, got ", h.devices_per_node);
  h.cpu_cores = static_cast<int>(optional_number(j, "cpu_cores", where, 0));
  parse_compute(h, field(j, "compute", where), where);
  h.memory_bandwidth = number(j, "memory_bandwidth", where);
  h.adamw_s_per_param = optional_number(j, "adamw_s_per_param", where, 0);
  h.comm_cpu_fraction = optional_number(j, "comm_cpu_fraction", where, 0);
  TORCH_CHECK(h.comm_cpu_fraction <= 1, "hardware file ", where,
              ": comm_cpu_fraction is a fraction, at most 1, got ", h.comm_cpu_fraction);
  h.network_cpu_fraction = optional_number(j, "network_cpu_fraction", where, 0);
  TORCH_CHECK(h.network_cpu_fraction <= 1, "hardware file ", where,
              ": network_cpu_fraction is a fraction, at most 1, got ", h.network_cpu_fraction);
  parse_links(h, j, where);
  return h;
}

// [Note: hidden collectives take CPU within a node]
// On a CPU host a collective within the host moves its bytes by CPU copies on the cores that
// compute, so the part of it hidden under compute still slows that compute, by comm_cpu_fraction
// of its time. A collective between hosts is paced by the network, and what it takes from the
// cores is the kernel's: TCP's copies and protocol work for what the wire carries, a fraction of
// a core while it runs (network_cpu_fraction, measured by bench/cluster/network_cpu.sh as the
// speed a matmul loop loses beside gloo's collectives across the link). Charging the hidden
// collectives between hosts at the within-host rate (the whole of their time) put GPT-2's step at
// W = 2 over two hosts 15% above the measured one; charging them nothing put a compute-bound
// batch 17% under it (bench/RESULTS.md, "The planner on the shaped link" and its third part).
// The exposed time is shared between collectives within and across nodes in proportion to their
// time.
double cpu_taken_by_hidden_collectives(const HardwareSpec& h, const Timelines& t) {
  if (t.comm_s() <= 0) return 0;
  const double hidden_share = 1 - t.exposed_s() / t.comm_s();
  const double within = t.within_node_comm_s();
  const double between = t.comm_s() - within;
  return std::max(0.0, hidden_share) *
         (h.comm_cpu_fraction * within + h.network_cpu_fraction * between);
}

StepTimePlan plan_step_time(const ModelMemorySpec& memory, const ModelComputeSpec& compute,
                            const StepTimeOptions& options, const HardwareSpec& hardware) {
  TORCH_CHECK(compute.units.size() == memory.units.size(), "plan_step_time: the compute spec has ",
              compute.units.size(), " units, the memory spec ", memory.units.size());
  TORCH_CHECK(compute.tokens >= 1, "plan_step_time: a micro-batch of ", compute.tokens, " tokens");
  const MemoryEstimateOptions& mo = options.memory();
  // Its broadcasts and reduces are rooted collectives the timelines do not price (yet).
  TORCH_CHECK(!mo.fsdp() || mo.strategy() != ShardingStrategy::kWholeTensor || mo.world_size() == 1,
              "plan_step_time: --strategy whole_tensor is not modelled by the step-time planner "
              "(its per-owner broadcasts and reduces have no timeline); fsdp-estimate gives its "
              "memory and bytes");
  const at::ScalarType dtype =
      mo.fsdp() ? mo.param_dtype().value_or(mo.master_dtype()) : mo.master_dtype();
  const int tp = options.tensor_parallel();
  TORCH_CHECK(tp >= 1, "plan_step_time: tensor_parallel must be at least 1, got ", tp);
  const int ranks = mo.world_size() * tp;  // every rank of the job shares the host's cores
  const Device device(hardware, dtype, ranks);
  Timelines timelines(compute, options, hardware, device);

  StepTimePlan plan;
  plan.memory = detail::replay_step(memory, mo, &timelines);
  const double stolen = cpu_taken_by_hidden_collectives(hardware, timelines);
  plan.step_s = timelines.now() + stolen;
  plan.compute_s = timelines.busy_s() + stolen;
  plan.exposed_comm_s = timelines.exposed_s();
  plan.comm_s = timelines.comm_s();
  plan.optimizer_s = timelines.optimizer_s();
  plan.tp_comm_s = timelines.tp_comm_s();
  plan.tokens_per_step = compute.tokens * mo.grad_accum() * mo.world_size();
  plan.tokens_per_s = plan.tokens_per_step / plan.step_s;

  const double model_forward =
      compute.model_forward_flops > 0 ? compute.model_forward_flops : forward_flops(compute);
  plan.model_flops_per_step = 3 * model_forward * mo.grad_accum() * mo.world_size();
  // The devices the job occupies: every rank's own, or the one host all ranks share.
  const double devices = hardware.cpu_cores > 0 ? 1.0 : ranks;
  plan.mfu = plan.model_flops_per_step / (plan.step_s * device.peak() * devices);
  return plan;
}

}  // namespace fsdp
