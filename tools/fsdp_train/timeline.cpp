// --trace's output (timeline.h). The memory track's "all tensors" is the process's counting
// allocator: one rank per process under --nproc and launchers, so it is the rank's own, and it
// includes the sharded state, activations and temporaries that the runtime's categories leave
// out.
#include <fsdp_train/timeline.h>

#include <fsdp/util/memory_counter.h>

#include <c10/util/Exception.h>
#include <fmt/format.h>

#include <sys/stat.h>
#include <cerrno>
#include <cstring>

namespace fsdp::train {

void trace_memory(RankMonitor& monitor) {
  Tracer& tracer = monitor.tracer();
  RankStats& stats = monitor.stats();
  stats.set_observer([&tracer] { tracer.sample_counters(); });
  tracer.set_counter_sampler("memory (bytes)", [&stats] {
    const MemorySnapshot live = stats.live();
    return Tracer::Sample{{"unsharded params", live.unsharded_param_bytes},
                          {"unsharded grads", live.unsharded_grad_bytes},
                          {"comm buffers", live.comm_buffer_bytes},
                          {"all tensors", process_cpu_memory().live_bytes()}};
  });
}

void write_timeline(const Tracer& tracer, const std::string& trace_dir, int rank, bool printing) {
  if (trace_dir.empty()) return;
  TORCH_CHECK(::mkdir(trace_dir.c_str(), 0755) == 0 || errno == EEXIST,
              "cannot create --trace directory '", trace_dir, "': ", std::strerror(errno));
  tracer.write_chrome_trace(trace_dir + "/rank" + std::to_string(rank) + ".json", rank);
  if (printing) {
    fmt::print("fsdp-train: wrote the timeline of each rank to {}/rank<N>.json\n", trace_dir);
  }
}

}  // namespace fsdp::train
