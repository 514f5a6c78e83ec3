// llm.c token shards (see token_shard.h). The parser trusts nothing in the header: the count
// is checked against the file's size before any token is read, so every read stays inside the
// buffer, and a shard either decodes completely or throws.
#include <fsdp/data/error.h>
#include <fsdp/data/labeled.h>
#include <fsdp/data/token_shard.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "llm.c shards are little-endian; a big-endian host would need byte swaps");

namespace fsdp::data {

ShardFormat shard_format_for(uint64_t vocab_size) {
  return vocab_size <= 65536 ? ShardFormat::kUint16 : ShardFormat::kUint32;
}

ShardHeader parse_shard_header(const uint8_t* data, size_t size, const std::string& source) {
  FSDP_DATA_CHECK(size >= kShardHeaderBytes, source, ": ", size,
                  " bytes, shorter than the 1024-byte header of an llm.c token shard");
  int32_t h[3];
  std::memcpy(h, data, sizeof(h));
  ShardHeader header{};
  if (h[0] == kShardMagicUint16) {
    FSDP_DATA_CHECK(h[1] == kShardVersionUint16 || h[1] == kShardVersionUint16Labeled, source,
                    ": version ", h[1], " at offset 4; a shard with magic ", kShardMagicUint16,
                    " must have version ", kShardVersionUint16, " (or ", kShardVersionUint16Labeled,
                    ": labeled)");
    header.format = ShardFormat::kUint16;
    header.token_bytes = 2;
    header.labeled = h[1] == kShardVersionUint16Labeled;
  } else if (h[0] == kShardMagicUint32) {
    FSDP_DATA_CHECK(h[1] == kShardVersionUint32 || h[1] == kShardVersionUint32Labeled, source,
                    ": version ", h[1], " at offset 4; a shard with magic ", kShardMagicUint32,
                    " must have version ", kShardVersionUint32, " (or ", kShardVersionUint32Labeled,
                    ": labeled)");
    header.format = ShardFormat::kUint32;
    header.token_bytes = 4;
    header.labeled = h[1] == kShardVersionUint32Labeled;
  } else {
    detail::throw_data_error(source, ": magic ", h[0],
                             " at offset 0 is not an llm.c token shard's (", kShardMagicUint16,
                             " or ", kShardMagicUint32, ")");
  }
  FSDP_DATA_CHECK(h[2] >= 0, source, ": negative token count ", h[2], " at offset 8");
  header.tokens = static_cast<uint64_t>(h[2]);
  const uint64_t per_token = header.token_bytes + (header.labeled ? sizeof(int32_t) : 0);
  const uint64_t expected = kShardHeaderBytes + header.tokens * per_token;
  FSDP_DATA_CHECK(size == expected, source, ": ", size, " bytes, but the header's ", header.tokens,
                  " tokens of ", header.token_bytes, " bytes",
                  header.labeled ? " and their 4-byte labels" : "", " need ", expected,
                  size < expected ? " (truncated)" : " (trailing bytes)");
  return header;
}

namespace {

// The labels after a labeled shard's tokens, each kIgnoreIndex or an id below vocab_size.
void decode_labels(const uint8_t* p, const ShardHeader& h, const std::string& source,
                   std::optional<uint64_t> vocab_size, std::vector<int32_t>& labels) {
  const size_t first = labels.size();
  labels.resize(first + h.tokens);
  if (h.tokens > 0) std::memcpy(labels.data() + first, p, h.tokens * 4);
  const uint64_t offset = kShardHeaderBytes + h.tokens * h.token_bytes;
  for (uint64_t i = 0; i < h.tokens; ++i) {
    const int32_t label = labels[first + i];
    if (label == kIgnoreIndex || (label >= 0 && (!vocab_size || uint64_t(label) < *vocab_size)))
      continue;
    labels.resize(first);
    detail::throw_data_error(source, ": label ", i, " (byte offset ", offset + i * 4, ") is ",
                             label, ", neither ", kIgnoreIndex, " (masked) nor an id below the ",
                             "vocabulary size",
                             vocab_size ? " " + std::to_string(*vocab_size) : "");
  }
}

}  // namespace

void decode_shard(const uint8_t* data, size_t size, const std::string& source,
                  std::optional<uint64_t> vocab_size, std::vector<uint32_t>& out,
                  std::vector<int32_t>* labels) {
  const ShardHeader h = parse_shard_header(data, size, source);
  FSDP_DATA_CHECK(!h.labeled || labels != nullptr, source,
                  ": a labeled shard (fine-tuning data), which this reader takes without labels");
  const size_t first = out.size();
  out.resize(first + h.tokens);
  const uint8_t* p = data + kShardHeaderBytes;
  if (h.format == ShardFormat::kUint16) {
    for (uint64_t i = 0; i < h.tokens; ++i) {
      uint16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      out[first + i] = v;
    }
  } else {
    if (h.tokens > 0) std::memcpy(out.data() + first, p, h.tokens * 4);
  }
  if (vocab_size) {
    for (uint64_t i = 0; i < h.tokens; ++i) {
      const uint32_t id = out[first + i];
      if (id >= *vocab_size) {
        out.resize(first);
        detail::throw_data_error(source, ": token ", i, " (byte offset ",
                                 kShardHeaderBytes + i * h.token_bytes, ") is id ", id,
                                 ", not below the vocabulary size ", *vocab_size);
      }
    }
  }
  if (!h.labeled) return;
  try {
    decode_labels(p + h.tokens * h.token_bytes, h, source, vocab_size, *labels);
  } catch (const DataError&) {
    out.resize(first);
    throw;
  }
}

void read_shard(const std::string& path, std::optional<uint64_t> vocab_size,
                std::vector<uint32_t>& out, std::vector<int32_t>* labels) {
  std::ifstream in(path, std::ios::binary);
  FSDP_DATA_CHECK(in.good(), "cannot open token shard '", path, "': ", std::strerror(errno));
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  FSDP_DATA_CHECK(!in.bad(), "cannot read token shard '", path, "'");
  decode_shard(bytes.data(), bytes.size(), path, vocab_size, out, labels);
}

std::vector<uint8_t> encode_shard(const std::vector<uint32_t>& tokens, ShardFormat format,
                                  const std::vector<int32_t>* labels) {
  FSDP_DATA_CHECK(tokens.size() < (uint64_t{1} << 31), "a shard holds fewer than 2^31 tokens, not ",
                  tokens.size());
  FSDP_DATA_CHECK(labels == nullptr || labels->size() == tokens.size(), "a labeled shard needs ",
                  "one label per token: ", tokens.size(), " tokens, ", labels ? labels->size() : 0,
                  " labels");
  const bool narrow = format == ShardFormat::kUint16;
  const size_t width = narrow ? 2 : 4;
  const size_t label_bytes = labels ? tokens.size() * 4 : 0;
  std::vector<uint8_t> bytes(kShardHeaderBytes + tokens.size() * width + label_bytes, 0);
  const int32_t version = narrow ? (labels ? kShardVersionUint16Labeled : kShardVersionUint16)
                                 : (labels ? kShardVersionUint32Labeled : kShardVersionUint32);
  const int32_t h[3] = {narrow ? kShardMagicUint16 : kShardMagicUint32, version,
                        static_cast<int32_t>(tokens.size())};
  std::memcpy(bytes.data(), h, sizeof(h));
  uint8_t* p = bytes.data() + kShardHeaderBytes;
  if (narrow) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      FSDP_DATA_CHECK(tokens[i] <= 0xFFFF, "token ", i, " is id ", tokens[i],
                      ", too large for a uint16 shard (magic ", kShardMagicUint16,
                      "); use the uint32 format");
      const auto v = static_cast<uint16_t>(tokens[i]);
      std::memcpy(p + 2 * i, &v, 2);
    }
  } else {
    if (!tokens.empty()) std::memcpy(p, tokens.data(), tokens.size() * 4);
  }
  if (label_bytes > 0) std::memcpy(p + tokens.size() * width, labels->data(), label_bytes);
  return bytes;
}

void write_shard(const std::string& path, const std::vector<uint32_t>& tokens, ShardFormat format,
                 const std::vector<int32_t>* labels) {
  const std::vector<uint8_t> bytes = encode_shard(tokens, format, labels);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    FSDP_DATA_CHECK(out.good(), "cannot create '", tmp, "': ", std::strerror(errno));
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    out.close();
    FSDP_DATA_CHECK(out.good(), "cannot write ", bytes.size(), " bytes to '", tmp, "'");
  }
  FSDP_DATA_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename '", tmp, "' to '",
                  path, "': ", std::strerror(errno));
}

}  // namespace fsdp::data
