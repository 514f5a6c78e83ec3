// The per-step measurements of step_probe.h. Memory comes from fsdp's counting allocator
// (installed under --metrics and --tensorboard) and the mesh's RankStats; what the process did
// comes from /proc/self (Linux; 0 elsewhere).
#include <fsdp_train/step_probe.h>

#include <ATen/ATen.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

namespace fsdp::train {
namespace {

int64_t tensor_bytes(const std::vector<at::Tensor>& tensors) {
  int64_t bytes = 0;
  for (const auto& t : tensors) bytes += t.defined() ? t.nbytes() : 0;
  return bytes;
}

int64_t optimizer_bytes(torch::optim::AdamW& optimizer) {
  int64_t bytes = 0;
  for (const auto& [key, state] : optimizer.state()) {
    const auto& s = static_cast<const torch::optim::AdamWParamState&>(*state);
    bytes += tensor_bytes({s.exp_avg(), s.exp_avg_sq(), s.max_exp_avg_sq()});
  }
  return bytes;
}

// The RankStepStats fields every rank sends, named once for packing and unpacking.
constexpr int64_t RankStepStats::*kGatheredFields[] = {&RankStepStats::param_bytes,
                                                       &RankStepStats::grad_bytes,
                                                       &RankStepStats::optim_bytes,
                                                       &RankStepStats::peak_unsharded_bytes,
                                                       &RankStepStats::all_gather_bytes,
                                                       &RankStepStats::reduce_scatter_bytes,
                                                       &RankStepStats::all_reduce_bytes,
                                                       &RankStepStats::peak_rss_bytes,
                                                       &RankStepStats::sent_bytes,
                                                       &RankStepStats::peak_alloc_bytes,
                                                       &RankStepStats::activation_bytes,
                                                       &RankStepStats::broadcast_bytes,
                                                       &RankStepStats::reduce_bytes,
                                                       &RankStepStats::tp_all_gather_calls,
                                                       &RankStepStats::tp_reduce_scatter_calls,
                                                       &RankStepStats::tp_all_reduce_calls,
                                                       &RankStepStats::host_kept_bytes,
                                                       &RankStepStats::host_returned_bytes};
constexpr int64_t kGatheredCount = std::size(kGatheredFields);

// A "<key> <number>" line of a /proc/self file (status: kB, io: bytes), or 0 if absent.
int64_t proc_self_field(const char* file, const std::string& key) {
  std::ifstream in(std::string("/proc/self/") + file);
  std::string line;
  while (std::getline(in, line)) {
    if (line.compare(0, key.size(), key) == 0) return std::atoll(line.c_str() + key.size());
  }
  return 0;
}
int64_t peak_rss_bytes() { return proc_self_field("status", "VmHWM:") * 1024; }
int64_t written_bytes() { return proc_self_field("io", "wchar:"); }

}  // namespace

double StepProbe::seconds_so_far() const {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

StepProbe begin_step(Run& run) {
  StepProbe probe;
  probe.start = StepProbe::Clock::now();
  if (run.tp_mesh) run.tp_mesh->reset_counters();
  if (run.mesh) {
    run.mesh->reset_counters();
    run.monitor->stats().reset_peaks();
    run.monitor->stats().reset_exposed_comm();
  }
  return probe;
}

void probe_before_forward(const Run& run, StepProbe& probe) {
  probe.written_at_start = written_bytes();  // after the dump: sent_bytes is the step's
  process_cpu_memory().reset_peak();
  probe.live_before_forward = run.thread_memory->live_bytes();
  probe.held_before_forward = run.mesh ? run.monitor->stats().live() : MemorySnapshot{};
}

// What forward left alive is what autograd saved, apart from gathered parameters (the root's;
// every block's under shard_grad_op) and communication buffers.
int64_t activation_bytes_since(const Run& run, const StepProbe& probe) {
  int64_t bytes = run.thread_memory->live_bytes() - probe.live_before_forward;
  if (run.mesh) {
    const MemorySnapshot held = run.monitor->stats().live();
    bytes -= held.unsharded_param_bytes - probe.held_before_forward.unsharded_param_bytes;
    bytes -= held.comm_buffer_bytes - probe.held_before_forward.comm_buffer_bytes;
  }
  return bytes;
}

int64_t grad_bytes(const std::vector<at::Tensor>& params) {
  int64_t bytes = 0;
  for (const auto& p : params) bytes += p.grad().defined() ? p.grad().nbytes() : 0;
  return bytes;
}

RankStepStats measure_rank(const Run& run, const StepProbe& probe) {
  RankStepStats mine;
  mine.rank = run.rank;
  if (run.count_memory) mine.activation_bytes = probe.activation_bytes;
  mine.grad_bytes = probe.grad_bytes;
  mine.sent_bytes = written_bytes() - probe.written_at_start;
  mine.peak_rss_bytes = peak_rss_bytes();
  mine.host_kept_bytes = probe.host_pages.kept_bytes;
  mine.host_returned_bytes = probe.host_pages.returned_bytes;
  mine.param_bytes = tensor_bytes(run.params);
  mine.optim_bytes = optimizer_bytes(*run.optimizer);
  if (run.count_memory) mine.peak_alloc_bytes = process_cpu_memory().peak_bytes();
  if (run.mesh) {
    mine.peak_unsharded_bytes = run.monitor->stats().peak_unsharded_bytes();
    const CommCounters counters = run.mesh->counters();
    // Under --tp the tensor-parallel group's collectives (activations, their gradients, whole
    // parameters' gradients, clipping's norm) count here too.
    const CommCounters tp = run.tp_mesh ? run.tp_mesh->counters() : CommCounters{};
    mine.all_gather_bytes = counters.all_gather.payload_bytes + tp.all_gather.payload_bytes;
    mine.reduce_scatter_bytes =
        counters.reduce_scatter.payload_bytes + tp.reduce_scatter.payload_bytes;
    mine.all_reduce_bytes = counters.all_reduce.payload_bytes + tp.all_reduce.payload_bytes;
    mine.broadcast_bytes = counters.broadcast.payload_bytes;
    mine.reduce_bytes = counters.reduce.payload_bytes;
    mine.tp_all_gather_calls = tp.all_gather.calls;
    mine.tp_reduce_scatter_calls = tp.reduce_scatter.calls;
    mine.tp_all_reduce_calls = tp.all_reduce.calls;
  }
  return mine;
}

std::vector<RankStepStats> gather_stats(const RankStepStats& mine, ProcessGroup* group) {
  if (group == nullptr) return {mine};
  const int world = group->size();
  at::Tensor local = at::empty({kGatheredCount}, at::kLong);
  for (int64_t i = 0; i < kGatheredCount; ++i)
    local.data_ptr<int64_t>()[i] = mine.*kGatheredFields[i];
  at::Tensor all = at::empty({world * kGatheredCount}, at::kLong);
  group->all_gather_into_tensor(all, local)->wait();
  std::vector<RankStepStats> result(world);
  for (int r = 0; r < world; ++r) {
    result[r].rank = r;
    const int64_t* row = all.data_ptr<int64_t>() + kGatheredCount * r;
    for (int64_t i = 0; i < kGatheredCount; ++i) result[r].*kGatheredFields[i] = row[i];
  }
  return result;
}

}  // namespace fsdp::train
