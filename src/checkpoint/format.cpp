// safetensors headers and the sharded checkpoint's index: strict parsers and their writers.
//
// Invariants every parsed value satisfies (the rest of the checkpoint code relies on them and
// never re-checks): shapes are non-negative and their element and byte counts fit in int64;
// an entry's byte range matches its shape and dtype; the entries tile the data section and the
// data section ends where the file ends; an index's shards tile dim 0 of their tensor, each on
// an existing rank, at most once per rank. No LibTorch here: this file is fuzzed on its own.
#include <fsdp/checkpoint/format.h>

#include "checkpoint/checksum.h"
#include "checkpoint/json_checks.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>

namespace fsdp::checkpoint {
namespace {

using namespace json_checks;  // NOLINT(google-build-using-namespace): this file's vocabulary

constexpr char kIndexFormat[] = "fsdp-sharded-checkpoint";

struct DtypeInfo {
  Dtype dtype;
  const char* name;
  int64_t size;
};
constexpr std::array<DtypeInfo, 15> kDtypes = {{
    {Dtype::kBool, "BOOL", 1},
    {Dtype::kU8, "U8", 1},
    {Dtype::kI8, "I8", 1},
    {Dtype::kU16, "U16", 2},
    {Dtype::kI16, "I16", 2},
    {Dtype::kF16, "F16", 2},
    {Dtype::kBF16, "BF16", 2},
    {Dtype::kU32, "U32", 4},
    {Dtype::kI32, "I32", 4},
    {Dtype::kF32, "F32", 4},
    {Dtype::kU64, "U64", 8},
    {Dtype::kI64, "I64", 8},
    {Dtype::kF64, "F64", 8},
    {Dtype::kF8E4M3, "F8_E4M3", 1},
    {Dtype::kF8E5M2, "F8_E5M2", 1},
}};

}  // namespace

const char* dtype_name(Dtype dtype) {
  for (const auto& d : kDtypes) {
    if (d.dtype == dtype) return d.name;
  }
  return "?";
}

std::optional<Dtype> dtype_from_name(std::string_view name) {
  for (const auto& d : kDtypes) {
    if (name == d.name) return d.dtype;
  }
  return std::nullopt;
}

int64_t dtype_size(Dtype dtype) {
  for (const auto& d : kDtypes) {
    if (d.dtype == dtype) return d.size;
  }
  return 1;
}

int64_t TensorEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const TensorEntry* SafetensorsHeader::find(std::string_view name) const {
  for (const auto& e : entries) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

uint64_t decode_header_length(const uint8_t* first8) {
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | first8[i];
  return n;
}

namespace {

void check_header_size(uint64_t n, uint64_t file_size) {
  if (n > kMaxHeaderBytes) {
    fail("header of " + std::to_string(n) + " bytes exceeds the limit of " +
         std::to_string(kMaxHeaderBytes));
  }
  if (file_size < 8 || n > file_size - 8) {
    fail("header of " + std::to_string(n) + " bytes does not fit in a file of " +
         std::to_string(file_size) + " bytes (truncated?)");
  }
}

void parse_metadata(const json& value, SafetensorsHeader& header) {
  if (!value.is_object()) fail("__metadata__ must be an object of strings");
  for (const auto& m : value.items()) {
    header.metadata[m.key()] = as_string(m.value(), "__metadata__ value " + quote_name(m.key()));
  }
}

// One tensor's entry, its byte range checked against its shape and dtype.
TensorEntry parse_tensor_entry(const std::string& name, const json& value) {
  const std::string where = "tensor " + quote_name(name);
  if (name.empty()) fail("a tensor has an empty name");
  if (!value.is_object()) fail(where + " must be an object");
  expect_only(value, {"dtype", "shape", "data_offsets"}, where);
  TensorEntry e;
  e.name = name;
  e.dtype = parse_dtype(member(value, "dtype", where), where + " dtype");
  e.shape = parse_shape(member(value, "shape", where), where + " shape");
  const json& offsets = member(value, "data_offsets", where);
  if (!offsets.is_array() || offsets.size() != 2) {
    fail(where + " data_offsets must be [begin, end]");
  }
  e.begin = as_u64(offsets[0], where + " data_offsets");
  e.end = as_u64(offsets[1], where + " data_offsets");
  if (e.end < e.begin) {
    fail(where + " ends before it begins: [" + std::to_string(e.begin) + ", " +
         std::to_string(e.end) + ")");
  }
  const uint64_t bytes = checked_size(e.shape, e.dtype, where).second;
  if (e.nbytes() != bytes) {
    fail(where + " has shape " + shape_string(e.shape) + " of " + dtype_name(e.dtype) +
         ", which is " + std::to_string(bytes) + " bytes, but its data_offsets span " +
         std::to_string(e.nbytes()));
  }
  return e;
}

// Sorts the entries by offset and checks that they tile the data section, which ends where
// the file ends; sets data_offset and data_bytes.
void tile_entries(SafetensorsHeader& header, uint64_t n, uint64_t file_size) {
  std::sort(header.entries.begin(), header.entries.end(),
            [](const TensorEntry& a, const TensorEntry& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  uint64_t expected = 0;
  for (const auto& e : header.entries) {
    if (e.begin != expected) {
      fail("tensor " + quote_name(e.name) + " starts at byte " + std::to_string(e.begin) +
           " of the data but the previous tensor ends at " + std::to_string(expected) +
           (e.begin > expected ? " (a hole)" : " (an overlap)"));
    }
    expected = e.end;
  }
  header.data_offset = 8 + n;
  header.data_bytes = expected;
  if (expected != file_size - header.data_offset) {
    fail("the tensors hold " + std::to_string(expected) + " bytes but the file has " +
         std::to_string(file_size - header.data_offset) + " bytes of data" +
         (expected > file_size - header.data_offset ? " (truncated?)" : " (trailing bytes)"));
  }
}

}  // namespace

SafetensorsHeader parse_safetensors_header(std::string_view header_json, uint64_t file_size) {
  const uint64_t n = header_json.size();
  check_header_size(n, file_size);
  const json j = parse_json(header_json, "the header");
  if (!j.is_object()) fail("the header must be a JSON object, got " + std::string(j.type_name()));

  SafetensorsHeader header;
  for (const auto& item : j.items()) {
    if (item.key() == "__metadata__") {
      parse_metadata(item.value(), header);
    } else {
      header.entries.push_back(parse_tensor_entry(item.key(), item.value()));
    }
  }
  tile_entries(header, n, file_size);
  return header;
}

SafetensorsHeader parse_safetensors(const uint8_t* data, size_t size) {
  if (size < 8) fail("file of " + std::to_string(size) + " bytes is too short for a header");
  const uint64_t n = decode_header_length(data);
  if (n > kMaxHeaderBytes || n > size - 8) {
    fail("header length " + std::to_string(n) + " does not fit in a file of " +
         std::to_string(size) + " bytes");
  }
  return parse_safetensors_header(
      std::string_view(reinterpret_cast<const char*>(data) + 8, static_cast<size_t>(n)), size);
}

uint64_t assign_offsets(std::vector<TensorEntry>& entries) {
  uint64_t offset = 0;
  for (auto& e : entries) {
    const uint64_t bytes = checked_size(e.shape, e.dtype, "tensor " + quote_name(e.name)).second;
    e.begin = offset;
    if (__builtin_add_overflow(offset, bytes, &offset)) fail("the data section is too large");
    e.end = offset;
  }
  return offset;
}

std::string encode_safetensors_header(const std::vector<TensorEntry>& entries,
                                      const std::map<std::string, std::string>& metadata) {
  json j = json::object();
  if (!metadata.empty()) j["__metadata__"] = metadata;
  for (const auto& e : entries) {
    if (e.name.empty() || e.name == "__metadata__" || j.contains(e.name)) {
      fail("cannot write a tensor named " + quote_name(e.name) + " (empty, reserved or repeated)");
    }
    j[e.name] = {
        {"dtype", dtype_name(e.dtype)}, {"shape", e.shape}, {"data_offsets", {e.begin, e.end}}};
  }
  std::string text = j.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((uint64_t(text.size()) >> (8 * i)) & 0xff);
  return out + text;
}

std::string checksum_hex(uint64_t value) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(value));
  return buf;
}

std::optional<uint64_t> parse_checksum_hex(std::string_view hex) {
  if (hex.size() != 16) return std::nullopt;
  uint64_t v = 0;
  for (char c : hex) {
    int d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else
      return std::nullopt;
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  return v;
}

int64_t TensorRecord::row_numel() const {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

std::string rank_file_name(int rank, int world_size) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "rank_%05d-of-%05d.safetensors", rank, world_size);
  return buf;
}

std::string serialize_checkpoint_index(const CheckpointIndex& index) {
  json j = json::object();
  j["format"] = kIndexFormat;
  j["version"] = kIndexVersion;
  j["world_size"] = index.world_size;
  j["step"] = index.step;
  json files = json::array();
  for (const auto& f : index.files) {
    files.push_back({{"name", f.name}, {"bytes", f.bytes}, {"xxh3_64", checksum_hex(f.checksum)}});
  }
  j["files"] = files;
  json tensors = json::object();
  for (const auto& [key, t] : index.tensors) {
    json shards = json::array();
    for (const auto& s : t.shards) {
      shards.push_back({{"rank", s.rank},
                        {"offset", s.offset},
                        {"rows", s.rows},
                        {"xxh3_64", checksum_hex(s.checksum)}});
    }
    tensors[key] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"shards", shards}};
  }
  j["tensors"] = tensors;
  if (!index.optimizer.empty()) {
    j["optimizer"] = {{"type", index.optimizer}, {"steps", index.optimizer_steps}};
  }
  if (const auto& g = index.grad_scaler) j["grad_scaler"] = grad_scaler_json(*g);
  j["rng_cpu"] = rng_states_json(index.rng_states);
  j["user"] = parse_json(index.user_json, "the user JSON");
  if (!j["user"].is_object()) fail("the user JSON must be an object");
  j["xxh3_64"] = checksum_hex(detail::xxh3(j.dump().data(), j.dump().size()));
  return j.dump(1) + "\n";
}

namespace {

// Checks the index's format, version and (when asked) its checksum.
void check_index_identity(const json& j, bool verify_checksum) {
  const std::string where = "the index";
  if (as_string(member(j, "format", where), "format") != kIndexFormat) {
    fail("the index's format is not \"" + std::string(kIndexFormat) + "\"");
  }
  const int64_t version = as_i64(member(j, "version", where), "version");
  if (version != kIndexVersion) {
    fail("index version " + std::to_string(version) + " is not supported (this build reads " +
         std::to_string(kIndexVersion) + ")");
  }
  const uint64_t stored_sum = parse_checksum(member(j, "xxh3_64", where), "the index checksum");
  if (!verify_checksum) return;
  json body = j;
  body.erase("xxh3_64");
  const std::string canonical = body.dump();
  const uint64_t actual = detail::xxh3(canonical.data(), canonical.size());
  if (actual != stored_sum) {
    fail("the index's checksum does not match its content (stored " + checksum_hex(stored_sum) +
         ", computed " + checksum_hex(actual) + "): the file is corrupted");
  }
}

// The rank files, one per rank, each with its canonical name.
std::vector<FileRecord> parse_files(const json& files, int world) {
  if (!files.is_array() || files.size() != static_cast<size_t>(world)) {
    fail("the index must list " + std::to_string(world) + " files, one per rank");
  }
  std::vector<FileRecord> out;
  for (int r = 0; r < world; ++r) {
    const json& f = files[static_cast<size_t>(r)];
    const std::string fw = "file " + std::to_string(r);
    if (!f.is_object()) fail(fw + " must be an object");
    expect_only(f, {"name", "bytes", "xxh3_64"}, fw);
    FileRecord record;
    record.name = as_string(member(f, "name", fw), fw + " name");
    if (record.name != rank_file_name(r, world)) {
      fail(fw + " is named " + quote_name(record.name) + ", expected " +
           quote_name(rank_file_name(r, world)));
    }
    record.bytes = as_u64(member(f, "bytes", fw), fw + " bytes");
    record.checksum = parse_checksum(member(f, "xxh3_64", fw), fw + " checksum");
    out.push_back(std::move(record));
  }
  return out;
}

// One shard of tensor `tw` (its description in messages), which must start at row `expected`
// on a rank of the world that holds no other shard of it (`ranks`, updated).
ShardRecord parse_shard(const json& s, const std::string& tw, const TensorRecord& record,
                        int64_t world, int64_t expected, std::set<int>& ranks) {
  if (!s.is_object()) fail(tw + " has a shard that is not an object");
  expect_only(s, {"rank", "offset", "rows", "xxh3_64"}, tw + " shard");
  ShardRecord shard;
  const int64_t rank = as_i64(member(s, "rank", tw), tw + " shard rank");
  if (rank >= world) {
    fail(tw + " has a shard on rank " + std::to_string(rank) + " of a world of " +
         std::to_string(world));
  }
  shard.rank = static_cast<int>(rank);
  if (!ranks.insert(shard.rank).second)
    fail(tw + " has two shards on rank " + std::to_string(rank));
  shard.offset = as_i64(member(s, "offset", tw), tw + " shard offset");
  shard.rows = as_i64(member(s, "rows", tw), tw + " shard rows");
  shard.checksum = parse_checksum(member(s, "xxh3_64", tw), tw + " shard checksum");
  if (shard.offset != expected || shard.rows < 1 || shard.rows > record.dim0() - expected) {
    fail(tw + " shard on rank " + std::to_string(rank) + " holds rows [" +
         std::to_string(shard.offset) + ", +" + std::to_string(shard.rows) +
         ") but the shards must tile [0, " + std::to_string(record.dim0()) +
         ") in order; the next row is " + std::to_string(expected));
  }
  return shard;
}

// One tensor, its shards tiling dim 0 in order.
TensorRecord parse_tensor_record(const std::string& key, const json& t, int64_t world) {
  const std::string tw = "tensor " + quote_name(key);
  if (key.empty()) fail("a tensor has an empty key");
  if (!t.is_object()) fail(tw + " must be an object");
  expect_only(t, {"dtype", "shape", "shards"}, tw);
  TensorRecord record;
  record.dtype = parse_dtype(member(t, "dtype", tw), tw + " dtype");
  record.shape = parse_shape(member(t, "shape", tw), tw + " shape");
  checked_size(record.shape, record.dtype, tw);
  const json& shards = member(t, "shards", tw);
  if (!shards.is_array()) fail(tw + " shards must be an array");
  int64_t expected = 0;
  std::set<int> ranks;
  for (const auto& s : shards) {
    record.shards.push_back(parse_shard(s, tw, record, world, expected, ranks));
    expected += record.shards.back().rows;
  }
  if (expected != record.dim0()) {
    fail(tw + " shards cover " + std::to_string(expected) + " of its " +
         std::to_string(record.dim0()) + " rows");
  }
  return record;
}

void parse_optimizer(const json& o, CheckpointIndex& index) {
  if (!o.is_object()) fail("\"optimizer\" must be an object");
  expect_only(o, {"type", "steps"}, "optimizer");
  index.optimizer = as_string(member(o, "type", "optimizer"), "optimizer type");
  if (index.optimizer.empty()) fail("the optimizer type is empty");
  const json& steps = member(o, "steps", "optimizer");
  if (!steps.is_object()) fail("optimizer steps must be an object");
  for (const auto& s : steps.items()) {
    index.optimizer_steps[s.key()] = as_i64(s.value(), "optimizer step of " + quote_name(s.key()));
  }
}

}  // namespace

CheckpointIndex parse_checkpoint_index(std::string_view text, bool verify_checksum) {
  json j = parse_json(text, "the index");
  if (!j.is_object()) fail("the index must be a JSON object");
  const std::string where = "the index";
  expect_only(j,
              {"format", "version", "world_size", "step", "files", "tensors", "optimizer",
               "rng_cpu", "user", "grad_scaler", "xxh3_64"},
              where);
  check_index_identity(j, verify_checksum);

  CheckpointIndex index;
  const int64_t world = as_i64(member(j, "world_size", where), "world_size");
  if (world < 1 || world > kMaxWorldSize) {
    fail("world_size " + std::to_string(world) + " is outside [1, " +
         std::to_string(kMaxWorldSize) + "]");
  }
  index.world_size = static_cast<int>(world);
  index.step = as_i64(member(j, "step", where), "step");
  index.files = parse_files(member(j, "files", where), index.world_size);

  const json& tensors = member(j, "tensors", where);
  if (!tensors.is_object()) fail("\"tensors\" must be an object");
  for (const auto& item : tensors.items()) {
    index.tensors.emplace(item.key(), parse_tensor_record(item.key(), item.value(), world));
  }
  if (auto it = j.find("optimizer"); it != j.end()) parse_optimizer(*it, index);
  if (auto it = j.find("rng_cpu"); it != j.end()) index.rng_states = parse_rng_states(*it, world);
  if (auto it = j.find("grad_scaler"); it != j.end()) index.grad_scaler = parse_grad_scaler(*it);
  if (auto it = j.find("user"); it != j.end()) {
    if (!it->is_object()) fail("\"user\" must be an object");
    index.user_json = it->dump();
  }
  return index;
}

}  // namespace fsdp::checkpoint
