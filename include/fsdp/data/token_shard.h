// llm.c token shards (.bin), read and written without LibTorch.
//
// Layout, as llm.c's dev/data/data_common.py write_datafile makes it: a header of 256
// little-endian int32 (1024 bytes) holding magic, version and token count in its first three
// slots (the rest zero), then the tokens, little-endian:
//   kUint16: magic 20240520, version 1, uint16 tokens (llm.c's "gpt-2"; vocab <= 65,536)
//   kUint32: magic 20240801, version 7, uint32 tokens (llm.c's "llama-3"; larger vocabularies)
// The token count is an int32, so a shard holds fewer than 2^31 tokens. A file must be exactly
// header + count * token bytes long: a truncated or overlong shard is an error.
//
// fsdp's labeled shards (fine-tuning data, labeled.h) carry after the tokens one little-endian
// int32 label per token (kIgnoreIndex, -100, where the token does not train), and mark it with
// a version of their own under the same magic: version 2 for uint16 tokens, 8 for uint32. The
// header is otherwise the same, so the plain versions read as before, and llm.c's readers, which
// accept only versions 1 and 7, refuse a labeled shard instead of training on its tokens alone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::data {

enum class ShardFormat { kUint16, kUint32 };

constexpr size_t kShardHeaderBytes = 256 * sizeof(int32_t);
constexpr int32_t kShardMagicUint16 = 20240520;
constexpr int32_t kShardVersionUint16 = 1;
constexpr int32_t kShardMagicUint32 = 20240801;
constexpr int32_t kShardVersionUint32 = 7;
constexpr int32_t kShardVersionUint16Labeled = 2;
constexpr int32_t kShardVersionUint32Labeled = 8;

struct ShardHeader {
  ShardFormat format;
  uint64_t tokens;     // token count
  size_t token_bytes;  // 2 or 4
  bool labeled;        // int32 labels follow the tokens
};

// The smallest format that holds ids below vocab_size: kUint16 up to 65,536, else kUint32.
ShardFormat shard_format_for(uint64_t vocab_size);

// Checks a shard held in memory: magic, version, count and exact size. source names it in
// errors (with the byte offset). Throws DataError.
ShardHeader parse_shard_header(const uint8_t* data, size_t size, const std::string& source);

// Appends the shard's tokens to out; when vocab_size is given, every id must be below it
// (the error names source, the token's index and byte offset, its id and the vocab size).
// (optional) labels: a labeled shard's labels are appended to it (each kIgnoreIndex or below
// vocab_size), a plain shard appends none; without it, a labeled shard is refused.
void decode_shard(const uint8_t* data, size_t size, const std::string& source,
                  std::optional<uint64_t> vocab_size, std::vector<uint32_t>& out,
                  std::vector<int32_t>* labels = nullptr);

// Reads the shard at path (the whole file) and appends its tokens to out, as decode_shard.
void read_shard(const std::string& path, std::optional<uint64_t> vocab_size,
                std::vector<uint32_t>& out, std::vector<int32_t>* labels = nullptr);

// The bytes of a shard holding tokens in format, and a labeled one when labels is given (as
// many as tokens); throws when an id does not fit the format, the counts differ or there are
// 2^31 tokens or more.
std::vector<uint8_t> encode_shard(const std::vector<uint32_t>& tokens, ShardFormat format,
                                  const std::vector<int32_t>* labels = nullptr);

// Writes encode_shard(tokens, format, labels) to path (through a temporary file renamed into
// place, so a reader never sees half a shard). Throws naming the path on an I/O error.
void write_shard(const std::string& path, const std::vector<uint32_t>& tokens, ShardFormat format,
                 const std::vector<int32_t>* labels = nullptr);

}  // namespace fsdp::data
