// Exact counts of the bytes held by live CPU tensors, for memory tests and benchmarks.
//
// install_cpu_memory_counter() puts a counting wrapper in front of c10's CPU allocator (the one
// every CPU tensor and storage allocates through, including the runtime's re-filled parameter
// storages), so each allocation and free updates:
//   - the process-wide count (every thread), and
//   - the MemoryCounter active on the allocating thread (see CountAllocations), if any: a
//     free is charged back to the counter that paid for the allocation, whichever thread frees
//     it. With ranks as threads, one counter per rank thread gives per-rank figures (minus what
//     the process group's own threads allocate).
// Only allocations made after installation are counted; tensors created before keep their
// original allocator. Figures are the bytes requested, not what malloc rounds them to.
//
// Why not c10's own reporting: ProfiledCPUMemoryReporter only reports to the autograd
// profiler's thread-local state and keeps one process-wide total; saved-tensor hooks
// (at::SavedTensorDefaultHooks) take Python objects. Peak RSS (VmHWM) includes the malloc
// arena's retained pages and the libraries' own memory, so it is reported beside these counts,
// not instead of them.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

namespace fsdp {

// Live and peak bytes of the allocations charged to one counter. Thread-safe.
class MemoryCounter {
 public:
  int64_t live_bytes() const { return live_.load(std::memory_order_relaxed); }
  // Most bytes live at once since construction or the last reset_peak().
  int64_t peak_bytes() const { return peak_.load(std::memory_order_relaxed); }
  // The peak restarts from the live bytes.
  void reset_peak() { peak_.store(live_bytes(), std::memory_order_relaxed); }

  void add(int64_t bytes);

 private:
  std::atomic<int64_t> live_{0};
  std::atomic<int64_t> peak_{0};
};

// Installs the counting allocator (idempotent, thread-safe). Never uninstalled: tensors
// allocated through it must be freed through it.
void install_cpu_memory_counter();
bool cpu_memory_counter_installed();

// Every counted CPU allocation of the process. Zero until installed.
MemoryCounter& process_cpu_memory();

// While alive, CPU allocations made on this thread are also charged to counter. Nests: the
// innermost guard's counter is charged. Installs the counting allocator if needed.
class CountAllocations {
 public:
  explicit CountAllocations(std::shared_ptr<MemoryCounter> counter);
  ~CountAllocations();
  CountAllocations(const CountAllocations&) = delete;
  CountAllocations& operator=(const CountAllocations&) = delete;

 private:
  std::shared_ptr<MemoryCounter> previous_;
};

}  // namespace fsdp
