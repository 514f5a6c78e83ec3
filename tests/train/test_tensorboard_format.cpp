// The pieces of --tensorboard's event files, in process: CRC-32C against published check values
// (the CRC catalogue's "123456789", RFC 3720's iSCSI test vectors), protobuf's wire format
// against the examples of protobuf's encoding guide, and the record framing byte by byte. The
// whole file is read back by TensorBoard itself in test_fsdp_train_tensorboard.cpp.
#include <train/crc32c.h>
#include <train/tensorboard_event.h>

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace fsdp::train {
namespace {

std::string bytes(std::initializer_list<int> values) {
  std::string out;
  for (int v : values) out.push_back(static_cast<char>(v));
  return out;
}

uint32_t u32_at(const std::string& s, size_t at) {
  uint32_t v = 0;
  for (size_t i = 0; i < 4; ++i) v |= uint32_t(static_cast<uint8_t>(s[at + i])) << (8 * i);
  return v;
}

TEST(Crc32c, PublishedCheckValues) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xFF')), 0x62A8AB43u);
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending.push_back(static_cast<char>(i));
  EXPECT_EQ(crc32c(ascending), 0x46DD794Eu);
  std::string descending;
  for (int i = 31; i >= 0; --i) descending.push_back(static_cast<char>(i));
  EXPECT_EQ(crc32c(descending), 0x113FDB5Cu);
  EXPECT_EQ(crc32c(""), 0u);
}

TEST(Crc32c, ContinuesOverPieces) { EXPECT_EQ(crc32c("6789", crc32c("12345")), 0xE3069283u); }

TEST(Crc32c, MaskRotatesAndAddsTheConstant) {
  EXPECT_EQ(mask_crc(0), 0xa282ead8u);
  // 0x00008000 rotated right by 15 is 1.
  EXPECT_EQ(mask_crc(0x8000u), 0xa282ead9u);
  EXPECT_EQ(mask_crc(1), (1u << 17) + 0xa282ead8u);
}

TEST(ProtoWriter, VarintsAsProtobufsEncodingGuide) {
  auto varint = [](uint64_t v) {
    ProtoWriter w;
    w.varint(v);
    return w.bytes();
  };
  EXPECT_EQ(varint(0), bytes({0x00}));
  EXPECT_EQ(varint(1), bytes({0x01}));
  EXPECT_EQ(varint(127), bytes({0x7F}));
  EXPECT_EQ(varint(150), bytes({0x96, 0x01}));
  EXPECT_EQ(varint(300), bytes({0xAC, 0x02}));
  EXPECT_EQ(varint(UINT64_MAX),
            bytes({0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01}));
}

TEST(ProtoWriter, FieldsAsProtobufsEncodingGuide) {
  ProtoWriter int64;
  int64.int64_field(1, 150);  // the guide's Test1 { a: 150 }
  EXPECT_EQ(int64.bytes(), bytes({0x08, 0x96, 0x01}));
  ProtoWriter negative;
  negative.int64_field(2, -1);  // int64, not sint64: ten bytes
  EXPECT_EQ(negative.bytes(),
            bytes({0x10, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01}));
  ProtoWriter text;
  text.bytes_field(2, "testing");  // the guide's Test2 { b: "testing" }
  EXPECT_EQ(text.bytes(), bytes({0x12, 0x07, 't', 'e', 's', 't', 'i', 'n', 'g'}));
  ProtoWriter real;
  real.double_field(1, 1.0);
  EXPECT_EQ(real.bytes(), bytes({0x09, 0, 0, 0, 0, 0, 0, 0xF0, 0x3F}));
  ProtoWriter single;
  single.float_field(2, -2.5f);  // 0xC0200000
  EXPECT_EQ(single.bytes(), bytes({0x15, 0x00, 0x00, 0x20, 0xC0}));
}

TEST(TensorBoardEvent, FileVersionEvent) {
  EXPECT_EQ(file_version_event(1.0),
            bytes({0x09, 0, 0, 0, 0, 0, 0, 0xF0, 0x3F, 0x1A, 13}) + "brain.Event:2");
}

TEST(TensorBoardEvent, ScalarsEventNestsValuesInASummary) {
  // Event { wall_time: 1.0, step: 3, summary { value { tag: "a/b", simple_value: -2.5 } } }
  const std::string value = bytes({0x0A, 3}) + "a/b" + bytes({0x15, 0x00, 0x00, 0x20, 0xC0});
  const std::string summary = bytes({0x0A, static_cast<int>(value.size())}) + value;
  const std::string event =
      bytes({0x09, 0, 0, 0, 0, 0, 0, 0xF0, 0x3F, 0x10, 3, 0x2A, static_cast<int>(summary.size())}) +
      summary;
  EXPECT_EQ(scalars_event(1.0, 3, {{"a/b", -2.5f}}), event);
}

TEST(TensorBoardEvent, RecordFraming) {
  const std::string data = "123456789";
  const std::string record = tf_record(data);
  ASSERT_EQ(record.size(), 8 + 4 + data.size() + 4);
  EXPECT_EQ(record.substr(0, 8), bytes({9, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(u32_at(record, 8), mask_crc(crc32c(record.substr(0, 8))));
  EXPECT_EQ(record.substr(12, data.size()), data);
  EXPECT_EQ(u32_at(record, 12 + data.size()), mask_crc(0xE3069283u));
}

}  // namespace
}  // namespace fsdp::train
