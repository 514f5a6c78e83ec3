// PyTorch DCP's Hugging Face layout and fsdp's manifest beside it: strict parsers and their
// writers (see include/fsdp/checkpoint/format.h, last section).
//
// Invariants every assembled layout satisfies (dcp_hf.cpp relies on them): each tensor's chunks
// lie inside its global shape, do not overlap and cover it exactly, so a reader that copies
// every chunk's overlap with its own box fills the box completely. No LibTorch here: this file
// is fuzzed on its own (tests/fuzz/fuzz_dcp_hf.cpp).
#include <fsdp/checkpoint/format.h>

#include "checkpoint/json_checks.h"

#include <algorithm>
#include <cstdio>
#include <set>

namespace fsdp::checkpoint {
namespace {

using namespace json_checks;  // NOLINT(google-build-using-namespace): this file's vocabulary

constexpr char kManifestFormat[] = "fsdp-dcp-hf-checkpoint";
constexpr char kSavedOffsets[] = "saved_offsets";

// One tensor's entry of DCP_SHARDING_INFO: {"saved_offsets": [...]} with one offset per
// dimension of `e`, each chunk end within int64.
std::vector<int64_t> parse_offsets_entry(const json& value, const TensorEntry& e) {
  const std::string where = "DCP_SHARDING_INFO of " + quote_name(e.name);
  if (!value.is_object()) fail(where + " must be an object");
  expect_only(value, {kSavedOffsets}, where);
  std::vector<int64_t> offsets = parse_shape(member(value, kSavedOffsets, where), where);
  if (offsets.size() != e.shape.size()) {
    fail(where + " gives " + std::to_string(offsets.size()) + " offsets for a tensor of " +
         std::to_string(e.shape.size()) + " dimensions " + shape_string(e.shape));
  }
  for (size_t d = 0; d < offsets.size(); ++d) {
    int64_t end = 0;
    if (__builtin_add_overflow(offsets[d], e.shape[d], &end)) {
      fail(where + " offset " + std::to_string(offsets[d]) + " overflows");
    }
  }
  return offsets;
}

// Whether two chunks share an element.
bool overlap(const DcpChunk& a, const DcpChunk& b) {
  for (size_t d = 0; d < a.offsets.size(); ++d) {
    if (a.offsets[d] + a.sizes[d] <= b.offsets[d] || b.offsets[d] + b.sizes[d] <= a.offsets[d])
      return false;
  }
  return true;
}

std::string box_string(const DcpChunk& c) {
  std::string s = "[";
  for (size_t d = 0; d < c.offsets.size(); ++d) {
    s += (d ? ", " : "") + std::to_string(c.offsets[d]) + ":" +
         std::to_string(c.offsets[d] + c.sizes[d]);
  }
  return s + "]";
}

// Adds file's chunk of tensor e (at offsets) to the layout, checking that it agrees with the
// chunks of other files on dtype and dimensions.
void add_chunk(std::map<std::string, DcpTensor>& tensors, const TensorEntry& e,
               std::vector<int64_t> offsets, size_t file, const std::vector<DcpFileHeader>& files) {
  auto [it, inserted] = tensors.try_emplace(e.name);
  DcpTensor& t = it->second;
  if (inserted) {
    t.dtype = e.dtype;
    t.shape.assign(e.shape.size(), 0);
  } else if (t.dtype != e.dtype || t.shape.size() != e.shape.size()) {
    fail("tensor " + quote_name(e.name) + " is " + dtype_name(e.dtype) + " with " +
         std::to_string(e.shape.size()) + " dimensions in '" + files[file].name + "' but " +
         dtype_name(t.dtype) + " with " + std::to_string(t.shape.size()) + " in another file");
  }
  // The far end in each dimension, as DCP's reader computes the global shape: empty chunks
  // count too (FSDP2 puts a rank without rows at the end of dim 0).
  for (size_t d = 0; d < offsets.size(); ++d) {
    t.shape[d] = std::max(t.shape[d], offsets[d] + e.shape[d]);
  }
  if (e.numel() == 0) return;  // nothing to read
  if (t.chunks.size() >= kMaxDcpChunks) {
    fail("tensor " + quote_name(e.name) + " has more than " + std::to_string(kMaxDcpChunks) +
         " chunks");
  }
  t.chunks.push_back({file, std::move(offsets), e.shape});
}

// The chunks of t must cover its shape exactly, without overlapping.
void check_tiling(const std::string& name, const DcpTensor& t,
                  const std::vector<DcpFileHeader>& files) {
  const int64_t want = checked_size(t.shape, t.dtype, "tensor " + quote_name(name)).first;
  int64_t covered = 0;
  for (size_t i = 0; i < t.chunks.size(); ++i) {
    const DcpChunk& a = t.chunks[i];
    for (size_t j = 0; j < i; ++j) {
      if (overlap(a, t.chunks[j])) {
        fail("tensor " + quote_name(name) + ": chunk " + box_string(a) + " in '" +
             files[a.file].name + "' overlaps chunk " + box_string(t.chunks[j]) + " in '" +
             files[t.chunks[j].file].name + "'");
      }
    }
    int64_t n = 1;
    for (int64_t s : a.sizes) n *= s;  // fits: the file's entry was checked
    if (__builtin_add_overflow(covered, n, &covered))
      fail("tensor " + quote_name(name) + " overflows");
  }
  if (covered != want) {
    fail("tensor " + quote_name(name) + " of shape " + shape_string(t.shape) +
         ": its chunks cover " + std::to_string(covered) + " of its " + std::to_string(want) +
         " elements (a rank's file is missing, or one is from another checkpoint)");
  }
}

// A manifest's file path: "model/<name>.safetensors" or "optim/<name>.safetensors".
std::string parse_file_path(const json& f, const std::string& fw) {
  const std::string& path = as_string(member(f, "path", fw), fw + " path");
  const size_t slash = path.find('/');
  const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash);
  const std::string name = slash == std::string::npos ? "" : path.substr(slash + 1);
  const std::string suffix = ".safetensors";
  if ((dir != kDcpModelDir && dir != kDcpOptimDir) || name.size() <= suffix.size() ||
      name.find('/') != std::string::npos || name.compare(0, 2, "..") == 0 ||
      name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
    fail(fw + " path " + quote_name(path) + " is not model/<name>.safetensors or " +
         "optim/<name>.safetensors");
  }
  return path;
}

std::vector<DcpFileRecord> parse_manifest_files(const json& files) {
  if (!files.is_array()) fail("the manifest's files must be an array");
  std::vector<DcpFileRecord> out;
  std::set<std::string> seen;
  for (size_t i = 0; i < files.size(); ++i) {
    const json& f = files[i];
    const std::string fw = "manifest file " + std::to_string(i);
    if (!f.is_object()) fail(fw + " must be an object");
    expect_only(f, {"path", "bytes"}, fw);
    DcpFileRecord record{parse_file_path(f, fw), as_u64(member(f, "bytes", fw), fw + " bytes")};
    if (!seen.insert(record.path).second) fail(fw + " lists " + quote_name(record.path) + " again");
    out.push_back(std::move(record));
  }
  return out;
}

}  // namespace

std::string dcp_shard_file_name(int rank) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "shard-%05d-model-00001-of-00001.safetensors", rank + 1);
  return buf;
}

std::map<std::string, std::string> dcp_file_metadata(
    const std::map<std::string, std::vector<int64_t>>& offsets) {
  json info = json::object();
  for (const auto& [name, o] : offsets) info[name] = {{kSavedOffsets, o}};
  return {{kDcpShardingInfoKey, info.dump()}, {kDcpVersionKey, kDcpVersion}, {"format", "pt"}};
}

std::map<std::string, std::vector<int64_t>> parse_dcp_offsets(const SafetensorsHeader& header) {
  std::map<std::string, std::vector<int64_t>> out;
  auto it = header.metadata.find(kDcpShardingInfoKey);
  if (it == header.metadata.end()) {
    for (const auto& e : header.entries) out[e.name].assign(e.shape.size(), 0);
    return out;
  }
  const json info = parse_json(it->second, kDcpShardingInfoKey);
  if (!info.is_object()) fail(std::string(kDcpShardingInfoKey) + " must be a JSON object");
  for (const auto& e : header.entries) {
    auto entry = info.find(e.name);
    if (entry == info.end()) {
      fail(std::string(kDcpShardingInfoKey) + " has no offsets for tensor " + quote_name(e.name));
    }
    out[e.name] = parse_offsets_entry(*entry, e);
  }
  for (const auto& item : info.items()) {
    if (out.count(item.key()) == 0) {
      fail(std::string(kDcpShardingInfoKey) + " gives offsets for " + quote_name(item.key()) +
           ", which the file does not hold");
    }
  }
  return out;
}

std::map<std::string, DcpTensor> assemble_dcp_tensors(const std::vector<DcpFileHeader>& files) {
  std::map<std::string, DcpTensor> tensors;
  for (size_t f = 0; f < files.size(); ++f) {
    std::map<std::string, std::vector<int64_t>> offsets;
    try {
      offsets = parse_dcp_offsets(*files[f].header);
    } catch (const FormatError& e) {
      fail("'" + files[f].name + "': " + e.what());
    }
    for (const auto& e : files[f].header->entries) {
      add_chunk(tensors, e, std::move(offsets.at(e.name)), f, files);
    }
  }
  for (const auto& [name, t] : tensors) check_tiling(name, t, files);
  return tensors;
}

std::string serialize_dcp_manifest(const DcpManifest& manifest) {
  json j = json::object();
  j["format"] = kManifestFormat;
  j["version"] = kDcpManifestVersion;
  j["world_size"] = manifest.world_size;
  j["step"] = manifest.step;
  json files = json::array();
  for (const auto& f : manifest.files) files.push_back({{"path", f.path}, {"bytes", f.bytes}});
  j["files"] = files;
  if (const auto& g = manifest.grad_scaler) j["grad_scaler"] = grad_scaler_json(*g);
  j["rng_cpu"] = rng_states_json(manifest.rng_states);
  j["user"] = parse_json(manifest.user_json, "the user JSON");
  if (!j["user"].is_object()) fail("the user JSON must be an object");
  j["xxh3_64"] = checksum_hex(self_checksum(j));
  return j.dump(1) + "\n";
}

DcpManifest parse_dcp_manifest(std::string_view text, bool verify_checksum) {
  const std::string where = "the manifest";
  const json j = parse_json(text, "the manifest");
  if (!j.is_object()) fail("the manifest must be a JSON object");
  expect_only(j,
              {"format", "version", "world_size", "step", "files", "rng_cpu", "user", "grad_scaler",
               "xxh3_64"},
              where);
  if (as_string(member(j, "format", where), "format") != kManifestFormat) {
    fail("the manifest's format is not \"" + std::string(kManifestFormat) + "\"");
  }
  const int64_t version = as_i64(member(j, "version", where), "version");
  if (version != kDcpManifestVersion) {
    fail("manifest version " + std::to_string(version) + " is not supported (this build reads " +
         std::to_string(kDcpManifestVersion) + ")");
  }
  if (verify_checksum) verify_self_checksum(j, where);
  DcpManifest m;
  const int64_t world = as_i64(member(j, "world_size", where), "world_size");
  if (world < 1 || world > kMaxWorldSize) {
    fail("world_size " + std::to_string(world) + " is outside [1, " +
         std::to_string(kMaxWorldSize) + "]");
  }
  m.world_size = static_cast<int>(world);
  m.step = as_i64(member(j, "step", where), "step");
  m.files = parse_manifest_files(member(j, "files", where));
  if (auto it = j.find("rng_cpu"); it != j.end()) m.rng_states = parse_rng_states(*it, world);
  if (auto it = j.find("grad_scaler"); it != j.end()) m.grad_scaler = parse_grad_scaler(*it);
  if (auto it = j.find("user"); it != j.end()) {
    if (!it->is_object()) fail("\"user\" must be an object");
    m.user_json = it->dump();
  }
  return m;
}

}  // namespace fsdp::checkpoint
