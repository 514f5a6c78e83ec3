// Every multi-byte number is written byte by byte, low byte first, so the encoding does not
// depend on the host's byte order. See [Note: TensorBoard events encoded by hand].
#include <train/tensorboard_event.h>

#include <train/crc32c.h>

#include <cstring>

namespace fsdp::train {
namespace {

// Field numbers of event.proto's Event and summary.proto's Summary and Summary.Value.
constexpr int kEventWallTime = 1;
constexpr int kEventStep = 2;
constexpr int kEventFileVersion = 3;
constexpr int kEventSummary = 5;
constexpr int kSummaryValue = 1;
constexpr int kValueTag = 1;
constexpr int kValueSimpleValue = 2;

constexpr const char* kFileVersion = "brain.Event:2";

std::string little_endian_bytes(uint64_t value, int size) {
  std::string out(static_cast<size_t>(size), '\0');
  for (int i = 0; i < size; ++i) out[static_cast<size_t>(i)] = static_cast<char>(value >> (8 * i));
  return out;
}

}  // namespace

void ProtoWriter::varint(uint64_t value) {
  while (value >= 0x80) {
    bytes_.push_back(static_cast<char>((value & 0x7F) | 0x80));
    value >>= 7;
  }
  bytes_.push_back(static_cast<char>(value));
}

void ProtoWriter::key(int field, WireType type) {
  varint(static_cast<uint64_t>(field) << 3 | type);
}

void ProtoWriter::int64_field(int field, int64_t value) {
  key(field, kVarint);
  varint(static_cast<uint64_t>(value));
}

void ProtoWriter::double_field(int field, double value) {
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  key(field, kFixed64);
  little_endian(bits, 8);
}

void ProtoWriter::float_field(int field, float value) {
  uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof(bits));
  key(field, kFixed32);
  little_endian(bits, 4);
}

void ProtoWriter::bytes_field(int field, std::string_view value) {
  key(field, kLengthDelimited);
  varint(value.size());
  bytes_.append(value.data(), value.size());
}

void ProtoWriter::little_endian(uint64_t value, int size) {
  bytes_ += little_endian_bytes(value, size);
}

std::string file_version_event(double wall_time) {
  ProtoWriter event;
  event.double_field(kEventWallTime, wall_time);
  event.bytes_field(kEventFileVersion, kFileVersion);
  return event.bytes();
}

std::string scalars_event(double wall_time, int64_t step,
                          const std::vector<TensorBoardScalar>& scalars) {
  ProtoWriter summary;
  for (const TensorBoardScalar& s : scalars) {
    ProtoWriter value;
    value.bytes_field(kValueTag, s.tag);
    value.float_field(kValueSimpleValue, s.value);
    summary.bytes_field(kSummaryValue, value.bytes());
  }
  ProtoWriter event;
  event.double_field(kEventWallTime, wall_time);
  event.int64_field(kEventStep, step);
  event.bytes_field(kEventSummary, summary.bytes());
  return event.bytes();
}

std::string tf_record(std::string_view data) {
  const std::string length = little_endian_bytes(data.size(), 8);
  std::string record = length;
  record += little_endian_bytes(mask_crc(crc32c(length)), 4);
  record.append(data.data(), data.size());
  record += little_endian_bytes(mask_crc(crc32c(data)), 4);
  return record;
}

}  // namespace fsdp::train
