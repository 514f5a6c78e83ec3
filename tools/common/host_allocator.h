// Which allocator serves the program's host memory, for its banner: the programs are linked with
// jemalloc (tools/common/jemalloc_config.cpp, [Note: the programs keep freed pages]) where the
// build found it; otherwise, or under a sanitizer, glibc's malloc.
#pragma once

#include <string>

namespace fsdp::tools {

// "jemalloc 5.3.0, freed pages kept (dirty_decay_ms -1, muzzy_decay_ms -1)", or "glibc malloc
// (...)" naming what that costs. Found at run time (jemalloc's mallctl, where the process has
// it), so LD_PRELOAD and MALLOC_CONF show as they act.
std::string describe_host_allocator();

}  // namespace fsdp::tools
