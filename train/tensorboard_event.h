// TensorBoard's event file format, written without protobuf's library: the few fields of the
// Event and Summary messages a scalar needs, in protobuf's wire format, and the record framing
// around each message (a TFRecord). Decoded by TensorBoard's own reader in
// tests/tools/test_fsdp_train_tensorboard.cpp.
//
// [Note: TensorBoard events encoded by hand] libprotobuf would need TensorBoard's .proto files
// (event.proto, summary.proto), which we do not vendor, plus protoc at build time, and the
// LibTorch wheel carries a protobuf of its own whose symbols a second copy could clash with (as
// gloo's would). Five fields of three messages are a few lines of varints instead:
//   Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
//   Summary { repeated Value value = 1; }
//   Value   { string tag = 1; float simple_value = 2; }
// Fields are written in field-number order, as protobuf's own serializer does.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp::train {

// Protobuf's wire format, for the field kinds above. Appends to bytes().
class ProtoWriter {
 public:
  // Wire types: how a field's value is laid out after its key.
  enum WireType : uint8_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

  // Base-128, low group first, the high bit of each byte saying "more follows".
  void varint(uint64_t value);
  void key(int field, WireType type);
  // int64: a negative value is its two's complement, ten bytes (protobuf's int64, not sint64).
  void int64_field(int field, int64_t value);
  void double_field(int field, double value);  // little-endian IEEE 754
  void float_field(int field, float value);
  // A string, bytes, or an embedded message's encoding: its length, then the bytes.
  void bytes_field(int field, std::string_view value);

  const std::string& bytes() const { return bytes_; }

 private:
  void little_endian(uint64_t value, int size);
  std::string bytes_;
};

struct TensorBoardScalar {
  std::string tag;  // "train/loss"
  float value = 0;  // TensorBoard keeps scalars as float32 (Value.simple_value)
};

// The first event of every file: the format's version, "brain.Event:2".
std::string file_version_event(double wall_time);
// One step's scalars as one event (wall_time: seconds since the Unix epoch).
std::string scalars_event(double wall_time, int64_t step,
                          const std::vector<TensorBoardScalar>& scalars);

// A record as event files frame it: the data's length (uint64, little-endian), the masked
// CRC-32C of those 8 bytes, the data, the masked CRC-32C of the data (both uint32, little-endian).
std::string tf_record(std::string_view data);

}  // namespace fsdp::train
