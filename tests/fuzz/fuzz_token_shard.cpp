// libFuzzer target: the llm.c token shard parser on arbitrary bytes. Any input must decode or
// throw DataError; a decoded shard must re-encode to the same magic, version, count and token
// bytes (llm.c leaves header slots 3..255 unused, so they may differ), and every id must be
// below the vocabulary size taken from the input's last byte.
#include <fsdp/data/error.h>
#include <fsdp/data/token_shard.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fsdp::data;
  const std::optional<uint64_t> vocab = size > 0 && data[size - 1] > 0x80
                                            ? std::optional<uint64_t>(data[size - 1] * 300)
                                            : std::nullopt;
  std::vector<uint32_t> tokens;
  try {
    decode_shard(data, size, "fuzz.bin", vocab, tokens);
  } catch (const DataError&) {
    if (!tokens.empty()) __builtin_trap();  // a failed decode appends nothing
    return 0;
  }
  const ShardHeader h = parse_shard_header(data, size, "fuzz.bin");
  if (h.tokens != tokens.size()) __builtin_trap();
  for (uint32_t id : tokens) {
    if (vocab && id >= *vocab) __builtin_trap();
  }
  const std::vector<uint8_t> again = encode_shard(tokens, h.format);
  if (again.size() != size || std::memcmp(again.data(), data, 12) != 0 ||
      std::memcmp(again.data() + kShardHeaderBytes, data + kShardHeaderBytes,
                  size - kShardHeaderBytes) != 0) {
    __builtin_trap();
  }
  return 0;
}
