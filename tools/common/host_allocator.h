// Which allocator serves the program's host memory, for its banner: the programs are linked with
// jemalloc (tools/common/jemalloc_config.cpp, [Note: the programs keep freed pages]) where the
// build found it; otherwise, or under a sanitizer, glibc's malloc.
#pragma once

#include <cstddef>
#include <string>

namespace fsdp::tools {

// jemalloc's control interface (mallctl), looked up at run time rather than linked: this library
// is also linked into the tests, which run on glibc's malloc.
using Mallctl = int (*)(const char* name, void* old_value, size_t* old_size, void* new_value,
                        size_t new_size);

// The process's mallctl, or nullptr where its malloc is not jemalloc's.
Mallctl find_mallctl();

// Reads one of jemalloc's numeric or string controls into value; false when it has none.
template <typename T>
bool read_mallctl(Mallctl mallctl, const char* name, T* value) {
  size_t size = sizeof(T);
  return mallctl(name, value, &size, nullptr, 0) == 0;
}

// "jemalloc 5.3.0, freed pages kept (dirty_decay_ms -1, muzzy_decay_ms -1)", or "glibc malloc
// (...)" naming what that costs. Found at run time (jemalloc's mallctl, where the process has
// it), so LD_PRELOAD and MALLOC_CONF show as they act.
std::string describe_host_allocator();

}  // namespace fsdp::tools
