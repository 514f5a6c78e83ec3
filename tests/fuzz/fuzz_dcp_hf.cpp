// libFuzzer target: PyTorch DCP's Hugging Face layout (see run_fuzz.sh). The input is split at
// its first 0xff byte (none: all of it is the first part): the first part is a safetensors file
// whose DCP_SHARDING_INFO is parsed and assembled, twice (a second rank's file holding the same
// chunks must be refused as an overlap, or an empty chunk dropped); the second part is fsdp.json,
// with its own checksum check off so the fuzzer reaches the structure. Anything but a result
// whose invariants hold or a FormatError is a bug.
#include <fsdp/checkpoint/format.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace {

using namespace fsdp::checkpoint;

void check_layout(const SafetensorsHeader& h) {
  std::vector<DcpFileHeader> files = {{"a", &h}};
  const auto tensors = assemble_dcp_tensors(files);
  for (const auto& [name, t] : tensors) {
    int64_t covered = 0, want = 1;
    for (int64_t d : t.shape) want *= d;
    for (const auto& c : t.chunks) {
      if (c.offsets.size() != t.shape.size() || c.sizes.size() != t.shape.size()) __builtin_trap();
      int64_t n = 1;
      for (size_t d = 0; d < c.sizes.size(); ++d) {
        if (c.offsets[d] < 0 || c.offsets[d] + c.sizes[d] > t.shape[d]) __builtin_trap();
        n *= c.sizes[d];
      }
      covered += n;
    }
    if (covered != want) __builtin_trap();
  }
  files.push_back({"b", &h});
  try {
    assemble_dcp_tensors(files);
    for (const auto& [name, t] : tensors) {
      if (!t.chunks.empty()) __builtin_trap();  // the same chunk twice must overlap
    }
  } catch (const FormatError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const void* cut = std::memchr(data, 0xff, size);
  const size_t first = cut ? static_cast<size_t>(static_cast<const uint8_t*>(cut) - data) : size;
  try {
    check_layout(parse_safetensors(data, first));
  } catch (const FormatError&) {
  }
  if (cut == nullptr) return 0;
  try {
    const DcpManifest m = parse_dcp_manifest(
        std::string_view(reinterpret_cast<const char*>(data) + first + 1, size - first - 1), false);
    if (m.world_size < 1 || m.rng_states.size() > static_cast<size_t>(m.world_size))
      __builtin_trap();
    const DcpManifest back = parse_dcp_manifest(serialize_dcp_manifest(m));
    if (back.files.size() != m.files.size() || back.step != m.step) __builtin_trap();
  } catch (const FormatError&) {
  }
  return 0;
}
