// The counting CPU allocator behind include/fsdp/util/memory_counter.h.
//
// Invariants:
// - Every pointer handed out is recorded, with its size and the counter it was charged to, in
//   a table keyed by the pointer; the deleter looks it up, uncharges and frees through the
//   wrapped allocator's raw interface. The context of each DataPtr is the data pointer itself,
//   so the raw allocate/deallocate interface keeps working for code that uses it.
// - The table and the wrapper are leaked on purpose: tensors may be freed during static
//   destruction, after any static object would have been destroyed.
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <fsdp/util/memory_counter.h>

#include <array>
#include <mutex>
#include <unordered_map>

namespace fsdp {
namespace {

struct Entry {
  int64_t bytes;
  std::shared_ptr<MemoryCounter> counter;  // null: charged to the process only
};

// Sharded by pointer so ranks running as threads rarely contend.
class AllocationTable {
 public:
  void insert(void* ptr, Entry entry) {
    Shard& s = shard(ptr);
    std::lock_guard<std::mutex> lock(s.mutex);
    s.entries.emplace(ptr, std::move(entry));
  }
  bool take(void* ptr, Entry& out) {
    Shard& s = shard(ptr);
    std::lock_guard<std::mutex> lock(s.mutex);
    auto it = s.entries.find(ptr);
    if (it == s.entries.end()) return false;
    out = std::move(it->second);
    s.entries.erase(it);
    return true;
  }

 private:
  struct Shard {
    std::mutex mutex;
    std::unordered_map<void*, Entry> entries;
  };
  Shard& shard(void* ptr) {
    const auto key = reinterpret_cast<uintptr_t>(ptr) >> 6;  // allocations are 64-byte aligned
    return shards_[(key ^ (key >> 7)) % shards_.size()];
  }
  std::array<Shard, 16> shards_;
};

AllocationTable& table() {
  static auto* t = new AllocationTable();
  return *t;
}

MemoryCounter& process_counter() {
  static auto* c = new MemoryCounter();
  return *c;
}

thread_local std::shared_ptr<MemoryCounter> current_counter;

c10::Allocator* wrapped = nullptr;

void counted_free(void* ptr) {
  if (ptr == nullptr) return;
  Entry entry;
  TORCH_INTERNAL_ASSERT(table().take(ptr, entry),
                        "fsdp memory counter: freeing an unknown pointer");
  process_counter().add(-entry.bytes);
  if (entry.counter) entry.counter->add(-entry.bytes);
  wrapped->raw_deallocate(ptr);
}

class CountingAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    void* ptr = wrapped->raw_allocate(n);
    if (ptr != nullptr) {
      const auto bytes = static_cast<int64_t>(n);
      process_counter().add(bytes);
      if (current_counter) current_counter->add(bytes);
      table().insert(ptr, Entry{bytes, current_counter});
    }
    return {ptr, ptr, &counted_free, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &counted_free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override {
    default_copy_data(dest, src, count);
  }
};

std::once_flag install_once;
std::atomic<bool> installed{false};

}  // namespace

void MemoryCounter::add(int64_t bytes) {
  const int64_t now = live_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  int64_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void install_cpu_memory_counter() {
  std::call_once(install_once, [] {
    wrapped = c10::GetCPUAllocator();
    TORCH_CHECK(wrapped->raw_deleter() != nullptr,
                "fsdp memory counter: the CPU allocator has no raw interface to wrap");
    // Priority above the default allocator's, so the wrapper is what GetCPUAllocator returns.
    c10::SetCPUAllocator(new CountingAllocator(), /*priority=*/100);
    installed.store(true);
  });
}

bool cpu_memory_counter_installed() { return installed.load(); }

MemoryCounter& process_cpu_memory() { return process_counter(); }

CountAllocations::CountAllocations(std::shared_ptr<MemoryCounter> counter)
    : previous_(std::move(current_counter)) {
  install_cpu_memory_counter();
  current_counter = std::move(counter);
}

CountAllocations::~CountAllocations() { current_counter = std::move(previous_); }

}  // namespace fsdp
