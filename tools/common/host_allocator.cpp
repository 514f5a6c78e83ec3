// describe_host_allocator (host_allocator.h).
#include <common/host_allocator.h>

#include <dlfcn.h>
#include <fmt/format.h>
#include <sys/types.h>

#include <cstddef>
#include <cstring>
#include <string>

namespace fsdp::tools {
namespace {

// jemalloc's control interface, looked up rather than linked: this library is also linked into
// the tests, which run on glibc's malloc.
using Mallctl = int (*)(const char*, void*, size_t*, void*, size_t);

template <typename T>
bool read_option(Mallctl mallctl, const char* name, T* value) {
  size_t size = sizeof(T);
  return mallctl(name, value, &size, nullptr, 0) == 0;
}

}  // namespace

std::string describe_host_allocator() {
  const auto mallctl = reinterpret_cast<Mallctl>(dlsym(RTLD_DEFAULT, "mallctl"));
  if (mallctl == nullptr) {
    return "glibc malloc (a tensor over 32 MiB is mapped and faulted in anew on each "
           "allocation)";
  }
  const char* version = "?";
  ssize_t dirty = 0, muzzy = 0;
  read_option(mallctl, "version", &version);
  const std::string release(version, std::strcspn(version, "-"));  // "5.3.0-0-g<commit>"
  const bool decay = read_option(mallctl, "opt.dirty_decay_ms", &dirty) &&
                     read_option(mallctl, "opt.muzzy_decay_ms", &muzzy);
  if (!decay) return "jemalloc " + release;
  return fmt::format("jemalloc {}, {} (dirty_decay_ms {}, muzzy_decay_ms {})", release,
                     dirty < 0 && muzzy < 0 ? "freed pages kept" : "freed pages returned", dirty,
                     muzzy);
}

}  // namespace fsdp::tools
