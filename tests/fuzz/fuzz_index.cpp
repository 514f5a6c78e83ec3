// libFuzzer target: the sharded checkpoint's index parser (metadata.json) on arbitrary bytes,
// with the index's own checksum check off so the fuzzer reaches the structural validation (see
// run_fuzz.sh). A parsed index must satisfy its invariants and survive a serialize/parse round
// trip; every other input must throw FormatError.
#include <fsdp/checkpoint/format.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fsdp::checkpoint;
  CheckpointIndex index;
  try {
    index =
        parse_checkpoint_index(std::string_view(reinterpret_cast<const char*>(data), size), false);
  } catch (const FormatError&) {
    return 0;
  }
  try {
    if (index.world_size < 1 || index.files.size() != static_cast<size_t>(index.world_size))
      __builtin_trap();
    for (const auto& [key, t] : index.tensors) {
      int64_t next = 0;
      for (const auto& s : t.shards) {
        if (s.rank < 0 || s.rank >= index.world_size || s.offset != next || s.rows < 1)
          __builtin_trap();
        next += s.rows;
      }
      if (next != t.dim0()) __builtin_trap();
    }
    const CheckpointIndex again = parse_checkpoint_index(serialize_checkpoint_index(index), true);
    if (again.tensors.size() != index.tensors.size() || again.step != index.step) __builtin_trap();
  } catch (const FormatError&) {
    __builtin_trap();  // an index we parsed must serialize and parse back
  }
  return 0;
}
