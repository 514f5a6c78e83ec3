// llm.c token shards: the byte layout llm.c writes, round trips in both formats, and every
// kind of bad shard refused with the file and offset in the message.
#include <fsdp/data/error.h>
#include <fsdp/data/token_shard.h>

#include "support/data_util.h"

#include <gtest/gtest.h>

#include <cstring>

namespace fsdp::data {
namespace {

int32_t header_slot(const std::vector<uint8_t>& b, int i) {
  int32_t v;
  std::memcpy(&v, b.data() + 4 * i, 4);
  return v;
}

void expect_error(const std::vector<uint8_t>& bytes, std::optional<uint64_t> vocab,
                  std::initializer_list<const char*> needles) {
  std::vector<uint32_t> out;
  try {
    decode_shard(bytes.data(), bytes.size(), "shard.bin", vocab, out);
    ADD_FAILURE() << "decoded a bad shard";
  } catch (const DataError& e) {
    for (const char* n : needles) {
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what() << " lacks " << n;
    }
  }
}

TEST(TokenShard, LayoutIsLlmcs) {
  // llm.c's write_datafile: 256 int32 header (magic, version, count, zeros), then the tokens.
  const std::vector<uint8_t> b = encode_shard({1, 2, 50256}, ShardFormat::kUint16);
  ASSERT_EQ(b.size(), 1024u + 6);
  EXPECT_EQ(header_slot(b, 0), 20240520);
  EXPECT_EQ(header_slot(b, 1), 1);
  EXPECT_EQ(header_slot(b, 2), 3);
  for (int i = 3; i < 256; ++i) EXPECT_EQ(header_slot(b, i), 0);
  EXPECT_EQ(b[1024 + 4], 50256 & 0xFF);
  EXPECT_EQ(b[1024 + 5], 50256 >> 8);
  const std::vector<uint8_t> w = encode_shard({1, 128255}, ShardFormat::kUint32);
  ASSERT_EQ(w.size(), 1024u + 8);
  EXPECT_EQ(header_slot(w, 0), 20240801);
  EXPECT_EQ(header_slot(w, 1), 7);
  EXPECT_EQ(header_slot(w, 2), 2);
  EXPECT_EQ(shard_format_for(50257), ShardFormat::kUint16);
  EXPECT_EQ(shard_format_for(65536), ShardFormat::kUint16);
  EXPECT_EQ(shard_format_for(65537), ShardFormat::kUint32);
}

TEST(TokenShard, RoundTripsThroughFiles) {
  test::TempDir dir;
  std::vector<uint32_t> narrow, wide;
  for (uint32_t i = 0; i < 70000; ++i) {
    narrow.push_back(i % 65536);
    wide.push_back(i * 7);
  }
  write_shard(dir.file("a.bin"), narrow, ShardFormat::kUint16);
  write_shard(dir.file("b.bin"), wide, ShardFormat::kUint32);
  std::vector<uint32_t> out;
  read_shard(dir.file("a.bin"), 65536, out);
  EXPECT_EQ(out, narrow);
  out.clear();
  read_shard(dir.file("b.bin"), std::nullopt, out);
  EXPECT_EQ(out, wide);
  EXPECT_THROW(read_shard(dir.file("missing.bin"), std::nullopt, out), DataError);
  EXPECT_THROW(write_shard(dir.file("no/such/dir.bin"), narrow, ShardFormat::kUint16), DataError);
}

TEST(TokenShard, RefusesBadShardsNamingTheProblem) {
  const std::vector<uint8_t> good = encode_shard({5, 6, 7, 8}, ShardFormat::kUint16);
  expect_error(std::vector<uint8_t>(good.begin(), good.begin() + 100), std::nullopt,
               {"shard.bin", "100 bytes", "header"});
  expect_error(std::vector<uint8_t>(good.begin(), good.end() - 1), std::nullopt,
               {"shard.bin", "truncated", "1031 bytes"});
  std::vector<uint8_t> longer = good;
  longer.push_back(0);
  expect_error(longer, std::nullopt, {"trailing bytes"});
  std::vector<uint8_t> magic = good;
  magic[0] ^= 1;
  expect_error(magic, std::nullopt, {"magic", "offset 0"});
  std::vector<uint8_t> version = good;
  version[4] = 3;  // 2 is a labeled shard's (fine-tuning data)
  expect_error(version, std::nullopt, {"version 3", "offset 4"});
  std::vector<uint8_t> count = good;
  count[11] = 0x80;
  expect_error(count, std::nullopt, {"negative token count"});
  expect_error(good, 8, {"token 3", "byte offset 1030", "id 8", "vocabulary size 8"});
  EXPECT_THROW(encode_shard({70000}, ShardFormat::kUint16), DataError);
}

}  // namespace
}  // namespace fsdp::data
