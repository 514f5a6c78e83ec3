// The safetensors and index parsers against well-formed and hostile input, and the safetensors
// reader and writer on real files: every bad input must end in an error that says what is
// wrong, never a crash or a read outside the file.
#include <fsdp/checkpoint/format.h>
#include <fsdp/checkpoint/safetensors.h>

#include "support/checkpoint_util.h"
#include "support/test_support.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

namespace fsdp::checkpoint {
namespace {

using test::read_bytes;
using test::temp_dir;
using test::write_bytes;
using ::testing::HasSubstr;

// A whole safetensors file: header JSON (as given, not re-encoded) plus data_bytes zero bytes.
std::string file_with_header(const std::string& json, size_t data_bytes) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((uint64_t(json.size()) >> (8 * i)) & 0xff);
  return out + json + std::string(data_bytes, '\0');
}

std::string parse_error(const std::string& bytes) {
  try {
    parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  } catch (const FormatError& e) {
    return e.what();
  }
  return "";
}

TEST(SafetensorsFormat, ParsesAWellFormedHeader) {
  const std::string bytes = file_with_header(
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2],"data_offsets":[24,28]},)"
      R"("a":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},"z":{"dtype":"I64","shape":[0],"data_offsets":[28,28]}})",
      28);
  const SafetensorsHeader h =
      parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  ASSERT_EQ(h.entries.size(), 3u);
  EXPECT_EQ(h.entries[0].name, "a");  // in data order
  EXPECT_EQ(h.entries[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(h.entries[1].name, "b");
  EXPECT_EQ(h.entries[1].dtype, Dtype::kBF16);
  EXPECT_EQ(h.metadata.at("format"), "pt");
  EXPECT_EQ(h.data_bytes, 28u);
  EXPECT_EQ(h.data_offset, bytes.size() - 28);
}

TEST(SafetensorsFormat, RejectsHostileHeaders) {
  const std::string ok_entry = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  struct Case {
    std::string name;
    std::string bytes;
    std::string error;
  };
  const std::vector<Case> cases = {
      {"too short", std::string(5, '\0'), "too short"},
      {"length past the end", std::string("\xff\x00\x00\x00\x00\x00\x00\x00{}", 10),
       "does not fit"},
      {"length over the limit", std::string("\x00\x00\x00\x10\x00\x00\x00\x00{}", 10),
       "does not fit"},
      {"not JSON", file_with_header("{\"a\":", 0), "not valid JSON"},
      {"not an object", file_with_header("[1,2]", 0), "must be a JSON object"},
      {"invalid UTF-8", file_with_header("{\"\xff\":1}", 0), "not valid JSON"},
      {"duplicate name", file_with_header("{" + ok_entry + "," + ok_entry + "}", 8), "twice"},
      {"unknown dtype",
       file_with_header(R"({"a":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}})", 8),
       "not a safetensors dtype"},
      {"negative dim",
       file_with_header(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
       "non-negative integer"},
      {"fractional dim",
       file_with_header(R"({"a":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", 8),
       "non-negative integer"},
      {"shape overflow",
       file_with_header(
           R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
       "too many elements"},
      {"bytes disagree with shape",
       file_with_header(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
       "which is 12 bytes"},
      {"end before begin",
       file_with_header(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8),
       "ends before it begins"},
      {"offsets past the file",
       file_with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4),
       "truncated"},
      {"trailing bytes", file_with_header("{" + ok_entry + "}", 12), "trailing bytes"},
      {"hole", file_with_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
       "a hole"},
      {"overlap",
       file_with_header(
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
           8),
       "an overlap"},
      {"missing field", file_with_header(R"({"a":{"dtype":"F32","shape":[0]}})", 0),
       "no \"data_offsets\""},
      {"extra field",
       file_with_header(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0],"x":1}})", 0),
       "unexpected field"},
      {"three offsets",
       file_with_header(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0,0]}})", 0),
       "[begin, end]"},
      {"metadata not strings", file_with_header(R"({"__metadata__":{"a":1}})", 0),
       "must be a string"},
      {"deep nesting", file_with_header(std::string(200, '[') + std::string(200, ']'), 0),
       "nests deeper"},
  };
  for (const auto& c : cases) {
    EXPECT_THAT(parse_error(c.bytes), HasSubstr(c.error)) << c.name;
  }
}

TEST(SafetensorsFormat, EncodedHeadersParseBackAndArePadded) {
  std::vector<TensorEntry> entries = {
      {"w", Dtype::kF32, {3, 2}}, {"b", Dtype::kBF16, {5}}, {"s", Dtype::kI64, {}}};
  const uint64_t data = assign_offsets(entries);
  EXPECT_EQ(data, 24u + 10u + 8u);
  const std::string header = encode_safetensors_header(entries, {{"format", "pt"}});
  EXPECT_EQ(header.size() % 8, 0u);
  const std::string file = header + std::string(data, '\x01');
  const auto h = parse_safetensors(reinterpret_cast<const uint8_t*>(file.data()), file.size());
  ASSERT_EQ(h.entries.size(), 3u);
  EXPECT_EQ(h.entries[2].name, "s");
  EXPECT_TRUE(h.entries[2].shape.empty());
  EXPECT_EQ(h.entries[2].nbytes(), 8u);
}

CheckpointIndex small_index() {
  CheckpointIndex index;
  index.world_size = 2;
  index.step = 7;
  index.files = {{rank_file_name(0, 2), 100, 1}, {rank_file_name(1, 2), 90, 2}};
  TensorRecord t;
  t.dtype = Dtype::kF32;
  t.shape = {5, 3};
  t.shards = {{0, 0, 3, 11}, {1, 3, 2, 12}};
  index.tensors["model/w"] = t;
  index.optimizer = "AdamW";
  index.optimizer_steps["w"] = 7;
  index.rng_states = {std::string("\x00\x01\xff", 3), std::string("\x02", 1)};
  index.user_json = R"({"lr":0.003,"note":"x"})";
  return index;
}

TEST(CheckpointIndexFormat, RoundTrips) {
  const CheckpointIndex index = small_index();
  const CheckpointIndex back = parse_checkpoint_index(serialize_checkpoint_index(index));
  EXPECT_EQ(back.world_size, 2);
  EXPECT_EQ(back.step, 7);
  EXPECT_EQ(back.files[1].bytes, 90u);
  EXPECT_EQ(back.tensors.at("model/w").shards[1].rows, 2);
  EXPECT_EQ(back.tensors.at("model/w").shards[1].checksum, 12u);
  EXPECT_EQ(back.optimizer_steps.at("w"), 7);
  EXPECT_EQ(back.rng_states, index.rng_states);
  EXPECT_EQ(back.user_json, R"({"lr":0.003,"note":"x"})");
}

std::string index_error(const std::string& text, bool verify = false) {
  try {
    parse_checkpoint_index(text, verify);
  } catch (const FormatError& e) {
    return e.what();
  }
  return "";
}

TEST(CheckpointIndexFormat, RejectsCorruptOrInconsistentIndexes) {
  const std::string good = serialize_checkpoint_index(small_index());
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const auto pos = s.find(from);
    EXPECT_NE(pos, std::string::npos) << from;
    return s.replace(pos, from.size(), to);
  };
  // One changed digit: the JSON stays valid, only the checksum notices.
  EXPECT_THAT(index_error(replaced("\"step\": 7", "\"step\": 8"), true),
              HasSubstr("checksum does not match"));
  EXPECT_EQ(index_error(replaced("\"step\": 7", "\"step\": 8"), false), "");
  EXPECT_THAT(index_error(good.substr(0, good.size() / 2)), HasSubstr("not valid JSON"));
  EXPECT_THAT(index_error(replaced("\"world_size\": 2", "\"world_size\": 0")),
              HasSubstr("outside [1,"));
  EXPECT_THAT(index_error(replaced("\"world_size\": 2", "\"world_size\": 3")),
              HasSubstr("must list 3 files"));
  EXPECT_THAT(index_error(replaced("rank_00001-of-00002", "../../etc/passwd")),
              HasSubstr("expected 'rank_00001"));
  EXPECT_THAT(index_error(replaced("\"rows\": 2", "\"rows\": 3")), HasSubstr("tile"));
  EXPECT_THAT(index_error(replaced("\"rows\": 2", "\"rows\": 1")),
              HasSubstr("cover 4 of its 5 rows"));
  EXPECT_THAT(index_error(replaced("\"rank\": 1", "\"rank\": 5")),
              HasSubstr("on rank 5 of a world of 2"));
  EXPECT_THAT(index_error(replaced("\"rank\": 1", "\"rank\": 0")),
              HasSubstr("two shards on rank 0"));
  EXPECT_THAT(index_error(replaced("\"F32\"", "\"F33\"")), HasSubstr("not a safetensors dtype"));
  EXPECT_THAT(index_error(replaced("\"version\": 1", "\"version\": 9")),
              HasSubstr("not supported"));
  EXPECT_THAT(index_error(replaced("\"xxh3_64\": \"0000000000000001\"", "\"xxh3_64\": \"zz\"")),
              HasSubstr("16 lowercase hex"));
  EXPECT_THAT(index_error(replaced("\"user\": {", "\"user\": 3, \"x\": {")),
              HasSubstr("unexpected field"));
}

// --- files ---

TEST(SafetensorsFile, WritesAndReadsEveryDtypeBack) {
  const std::string path = temp_dir("st_roundtrip") + "/t.safetensors";
  std::vector<std::pair<std::string, at::Tensor>> tensors = {
      {"f32", at::randn({3, 4})},
      {"bf16", at::randn({5}).to(at::kBFloat16)},
      {"f64", at::randn({2, 2, 2}, at::kDouble)},
      {"i64", at::arange(7)},
      {"u8", at::arange(9).to(at::kByte)},
      {"scalar", at::scalar_tensor(3.5)},
      {"empty", at::empty({0, 4})},
      {"strided", at::randn({4, 6}).t()},
  };
  save_safetensors(path, tensors, {{"format", "pt"}});
  const auto back = load_safetensors(path);
  ASSERT_EQ(back.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(back.count(name)) << name;
    EXPECT_EQ(back.at(name).scalar_type(), t.scalar_type()) << name;
    EXPECT_TRUE(at::equal(back.at(name), t)) << name;
  }
  SafetensorsReader reader(path);
  EXPECT_TRUE(reader.verify_data_checksum());
  EXPECT_TRUE(reader.stored_checksum("f32").has_value());
  // A block of rows, and a block of columns read as rows of the transpose.
  at::Tensor rows = at::empty({2, 4});
  reader.read_rows(reader.entry("f32"), 1, 2, rows);
  EXPECT_TRUE(at::equal(rows, tensors[0].second.narrow(0, 1, 2)));
  at::Tensor cols = at::empty({2, 3});
  reader.read_columns_transposed(reader.entry("f32"), 1, 2, cols);
  EXPECT_TRUE(at::equal(cols, tensors[0].second.t().narrow(0, 1, 2)));
  EXPECT_THAT(test::error_message([&] { reader.read_rows(reader.entry("f32"), 2, 2, rows); }),
              HasSubstr("outside the 3 rows"));
}

TEST(SafetensorsFile, TruncatedFileIsRejected) {
  const std::string path = temp_dir("st_truncated") + "/t.safetensors";
  save_safetensors(path, {{"w", at::randn({64, 8})}});
  const std::string bytes = read_bytes(path);
  for (size_t keep : {size_t(0), size_t(7), size_t(8), size_t(40), bytes.size() - 1}) {
    write_bytes(path, bytes.substr(0, keep));
    const std::string error = test::error_message([&] { SafetensorsReader r(path); });
    EXPECT_THAT(error, HasSubstr("not a")) << "kept " << keep << " bytes";
    EXPECT_THAT(error, HasSubstr(path));
  }
}

TEST(SafetensorsFile, CorruptedHeaderAndDataAreRejected) {
  const std::string path = temp_dir("st_corrupt") + "/t.safetensors";
  save_safetensors(path, {{"w", at::randn({16, 8})}});
  const std::string bytes = read_bytes(path);
  std::string bad_header = bytes;
  bad_header[12] = '#';  // inside the JSON
  write_bytes(path, bad_header);
  EXPECT_THAT(test::error_message([&] { SafetensorsReader r(path); }),
              HasSubstr("not a valid safetensors file"));
  std::string bad_data = bytes;
  bad_data[bytes.size() - 3] ^= 0x10;
  write_bytes(path, bad_data);
  SafetensorsReader reader(path);
  EXPECT_THAT(test::error_message([&] { reader.read("w"); }),
              HasSubstr("is corrupted: tensor 'w'"));
  EXPECT_THAT(test::error_message([&] { reader.verify_data_checksum(); }),
              HasSubstr("is corrupted"));
  EXPECT_THAT(test::error_message([&] { SafetensorsReader r(path + ".missing"); }),
              HasSubstr("No such file"));
}

}  // namespace
}  // namespace fsdp::checkpoint
