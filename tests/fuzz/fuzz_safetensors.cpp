// libFuzzer target: the safetensors parser on arbitrary bytes (see run_fuzz.sh). Any input must
// either parse into a header whose invariants hold or throw FormatError; anything else (another
// exception, a sanitizer report, a trap) is a bug.
#include <fsdp/checkpoint/format.h>

#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fsdp::checkpoint;
  try {
    const SafetensorsHeader h = parse_safetensors(data, size);
    uint64_t expected = 0;
    for (const auto& e : h.entries) {
      if (e.begin != expected || e.end < e.begin) __builtin_trap();
      if (static_cast<uint64_t>(e.numel()) * static_cast<uint64_t>(dtype_size(e.dtype)) !=
          e.nbytes()) {
        __builtin_trap();
      }
      expected = e.end;
    }
    if (expected != h.data_bytes || h.data_offset + h.data_bytes != size) __builtin_trap();
  } catch (const FormatError&) {
  }
  return 0;
}
