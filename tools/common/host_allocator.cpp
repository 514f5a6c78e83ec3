// describe_host_allocator (host_allocator.h).
#include <common/host_allocator.h>

#include <dlfcn.h>
#include <fmt/format.h>
#include <sys/types.h>

#include <cstddef>
#include <cstring>
#include <string>

namespace fsdp::tools {

Mallctl find_mallctl() { return reinterpret_cast<Mallctl>(dlsym(RTLD_DEFAULT, "mallctl")); }

std::string describe_host_allocator() {
  const Mallctl mallctl = find_mallctl();
  if (mallctl == nullptr) {
    return "glibc malloc (a tensor over 32 MiB is mapped and faulted in anew on each "
           "allocation)";
  }
  const char* version = "?";
  ssize_t dirty = 0, muzzy = 0;
  read_mallctl(mallctl, "version", &version);
  const std::string release(version, std::strcspn(version, "-"));  // "5.3.0-0-g<commit>"
  const bool decay = read_mallctl(mallctl, "opt.dirty_decay_ms", &dirty) &&
                     read_mallctl(mallctl, "opt.muzzy_decay_ms", &muzzy);
  if (!decay) return "jemalloc " + release;
  return fmt::format("jemalloc {}, {} (dirty_decay_ms {}, muzzy_decay_ms {})", release,
                     dirty < 0 && muzzy < 0 ? "freed pages kept" : "freed pages returned", dirty,
                     muzzy);
}

}  // namespace fsdp::tools
