// On-disk formats of checkpoints, parsed and written without LibTorch.
//
// Three formats:
// - safetensors (https://github.com/huggingface/safetensors): an 8-byte little-endian header
//   length N, N bytes of JSON mapping each tensor name to {"dtype", "shape", "data_offsets"}
//   (plus an optional "__metadata__" object of strings), then the data section, which the
//   tensors' [begin, end) byte ranges cover exactly, without holes or overlaps.
// - the index of a sharded checkpoint (metadata.json): which rank file holds which rows of
//   which tensor, with a checksum per file and per stored slice, the step, the optimizer's
//   per-parameter steps, each rank's RNG state and the caller's own JSON (config, data
//   position).
// - PyTorch DCP's Hugging Face layout (torch.distributed.checkpoint.HuggingFaceStorageWriter
//   with save_distributed=True): safetensors files whose __metadata__ says where each stored
//   chunk sits in its global tensor (DCP_SHARDING_INFO), and our manifest beside them
//   (fsdp.json: step, RNG states, the caller's JSON, the files). See the last section.
//
// The parsers treat their input as hostile: every size, offset, shape and name is checked
// before anything is used, and every failure is a FormatError naming what is wrong, never a
// crash or an out-of-bounds read. They depend on nothing but the standard library and
// nlohmann-json (in the .cpp), so they build on their own for fuzzing (tests/fuzz/).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp::checkpoint {

// A file that is not a valid safetensors file or checkpoint index.
class FormatError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// safetensors' element types. dtype_name gives the format's spelling ("F32", "BF16", ...).
enum class Dtype : uint8_t {
  kBool,
  kU8,
  kI8,
  kU16,
  kI16,
  kF16,
  kBF16,
  kU32,
  kI32,
  kF32,
  kU64,
  kI64,
  kF64,
  kF8E4M3,
  kF8E5M2,
};
const char* dtype_name(Dtype dtype);
std::optional<Dtype> dtype_from_name(std::string_view name);
int64_t dtype_size(Dtype dtype);  // bytes per element

// The header may not exceed this many bytes: safetensors' own limit (100 MB).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// A JSON nesting depth past this is rejected before it can exhaust anything.
inline constexpr int kMaxJsonDepth = 64;

struct TensorEntry {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // byte offsets into the data section
  uint64_t end = 0;
  uint64_t nbytes() const { return end - begin; }
  int64_t numel() const;
};

struct SafetensorsHeader {
  std::vector<TensorEntry> entries;             // in data order (by begin)
  std::map<std::string, std::string> metadata;  // "__metadata__"
  uint64_t data_offset = 0;                     // where the data section starts in the file
  uint64_t data_bytes = 0;
  // The entry called name, or nullptr.
  const TensorEntry* find(std::string_view name) const;
};

// Reads the little-endian header length from a file's first 8 bytes.
uint64_t decode_header_length(const uint8_t* first8);

// Parses and validates the JSON header of a safetensors file of file_size bytes whose first 8
// bytes gave header_json.size(). Checks: the header fits the limit and the file; it is a JSON
// object of unique names; each entry has exactly a known dtype, a shape of non-negative
// integers and two data offsets; shape x dtype size equals the byte count (no overflow); the
// byte ranges tile the data section, which ends exactly at the end of the file; metadata
// values are strings. Throws FormatError naming the first problem.
SafetensorsHeader parse_safetensors_header(std::string_view header_json, uint64_t file_size);

// The same for a whole file in memory (the fuzzing entry point).
SafetensorsHeader parse_safetensors(const uint8_t* data, size_t size);

// Gives entries consecutive byte ranges in their order, starting at 0. Returns the data bytes.
// Throws FormatError if a shape is negative or a size overflows.
uint64_t assign_offsets(std::vector<TensorEntry>& entries);

// The bytes a safetensors file starts with: 8-byte length, JSON header (padded with spaces to
// a multiple of 8 bytes, as safetensors itself does), for entries whose offsets are assigned.
std::string encode_safetensors_header(const std::vector<TensorEntry>& entries,
                                      const std::map<std::string, std::string>& metadata);

// Lowercase hex of a 64-bit checksum (16 digits), and back (nullopt unless 16 hex digits).
std::string checksum_hex(uint64_t value);
std::optional<uint64_t> parse_checksum_hex(std::string_view hex);

// --- the sharded checkpoint's index (metadata.json) ---

inline constexpr int kIndexVersion = 1;
// The index's file name in a checkpoint directory.
inline constexpr char kIndexFileName[] = "metadata.json";
inline constexpr int kMaxWorldSize = 1 << 20;

// Rows [offset, offset + rows) of a tensor's dim 0, stored by rank in its file under the
// tensor's key, with the checksum of exactly those bytes.
struct ShardRecord {
  int rank = 0;
  int64_t offset = 0;
  int64_t rows = 0;
  uint64_t checksum = 0;
};

// A tensor of the checkpoint: "model/<parameter name>" or "optim/<state>/<parameter name>".
// Its shards tile dim 0 exactly, in order. A 0-D tensor is stored as one row.
struct TensorRecord {
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;  // global shape
  std::vector<ShardRecord> shards;
  int64_t dim0() const { return shape.empty() ? 1 : shape[0]; }
  int64_t row_numel() const;  // elements per row of dim 0
};

struct FileRecord {
  std::string name;  // rank_file_name(rank, world_size)
  uint64_t bytes = 0;
  uint64_t checksum = 0;  // of the whole file
};

// fp16's gradient scaler (fsdp/grad_scaler.h's GradScalerState), the same on every rank and so
// stored once: the scale (a positive, finite float32 value), the good steps since it last
// changed (in [0, growth_interval)) and its hyper-parameters (growth_factor > 1, backoff_factor
// in (0, 1), growth_interval >= 1).
struct GradScalerRecord {
  double scale = 0;
  int64_t growth_tracker = 0;
  double growth_factor = 0;
  double backoff_factor = 0;
  int64_t growth_interval = 0;
};

struct CheckpointIndex {
  int world_size = 1;
  int64_t step = 0;
  std::vector<FileRecord> files;                   // one per rank, in rank order
  std::map<std::string, TensorRecord> tensors;     // by key
  std::string optimizer;                           // "AdamW", or "" when no optimizer state
  std::map<std::string, int64_t> optimizer_steps;  // parameter name -> its optimizer step
  std::vector<std::string> rng_states;             // per rank (raw bytes); may be empty
  std::string user_json = "{}";                    // the caller's JSON object (re-serialized)
  std::optional<GradScalerRecord> grad_scaler;     // absent unless the run had one
};

// "rank_00001-of-00004.safetensors".
std::string rank_file_name(int rank, int world_size);

// Serializes index as JSON with a checksum of its own content.
std::string serialize_checkpoint_index(const CheckpointIndex& index);

// Parses and validates an index: the format name and version, world size in [1,
// kMaxWorldSize], one file per rank with its canonical name, tensors with known dtypes,
// non-negative shapes whose byte sizes do not overflow, shards on existing ranks that tile
// dim 0, and (verify_checksum) the index's own checksum. Throws FormatError.
CheckpointIndex parse_checkpoint_index(std::string_view text, bool verify_checksum = true);

// --- PyTorch DCP's Hugging Face layout ---
//
// What torch 2.11's HuggingFaceStorageWriter(path, save_distributed=True) writes: each rank's
// chunks of every tensor in path/shard-<rank + 1, 5 digits>-model-00001-of-00001.safetensors
// (no file for a rank with nothing to store), each chunk under its tensor's name, and in the
// file's __metadata__, besides "format": "pt" and "DCP_VERSION": "1.0", the JSON text
//   "DCP_SHARDING_INFO": {"<name>": {"saved_offsets": [o_0, ..., o_{n-1}]}, ...}
// giving every stored tensor's offset in each dimension of its global tensor. No index file:
// HuggingFaceStorageReader lists path's *.safetensors and takes a tensor's global shape to be
// the far end of its chunks in each dimension. A file without DCP_SHARDING_INFO holds whole
// tensors (offsets 0): what enable_consolidation=True leaves in path (the chunks then go to
// path/sharded/, which the reader does not list).

inline constexpr char kDcpShardingInfoKey[] = "DCP_SHARDING_INFO";
inline constexpr char kDcpVersionKey[] = "DCP_VERSION";
inline constexpr char kDcpVersion[] = "1.0";
// How many chunks of one tensor a layout may hold (the overlap check is quadratic in them).
inline constexpr size_t kMaxDcpChunks = 1 << 14;

// "shard-00001-model-00001-of-00001.safetensors": rank 0's file, as DCP names it.
std::string dcp_shard_file_name(int rank);

// The __metadata__ a rank file carries: DCP_SHARDING_INFO of these offsets (by tensor name),
// DCP_VERSION and "format": "pt".
std::map<std::string, std::string> dcp_file_metadata(
    const std::map<std::string, std::vector<int64_t>>& offsets);

// Each tensor's offsets in a file with this header: from DCP_SHARDING_INFO, which must be a
// JSON object giving exactly one non-negative offset per dimension for every tensor of the file
// (and name no other), with offset + size not overflowing; zeros when the file has none.
// Throws FormatError naming the fault.
std::map<std::string, std::vector<int64_t>> parse_dcp_offsets(const SafetensorsHeader& header);

struct DcpChunk {
  size_t file = 0;  // which of the files the layout was assembled from
  std::vector<int64_t> offsets;
  std::vector<int64_t> sizes;
};

// A tensor of a DCP checkpoint: its global shape and the chunks that tile it.
struct DcpTensor {
  Dtype dtype = Dtype::kF32;
  std::vector<int64_t> shape;
  std::vector<DcpChunk> chunks;  // non-empty ones only; a 0-D tensor has one
};

struct DcpFileHeader {
  std::string name;  // for messages
  const SafetensorsHeader* header = nullptr;
};

// The tensors of a checkpoint from the headers of all its files, checked: every file's offsets
// (parse_dcp_offsets), and for each tensor one dtype and one number of dimensions across files,
// chunks that do not overlap and together cover its global shape exactly (a missing rank file
// shows as a gap). Chunks with no elements (FSDP2 writes them for ranks that hold no rows of a
// tensor) are dropped. Throws FormatError naming the file(s), the tensor and the fault.
std::map<std::string, DcpTensor> assemble_dcp_tensors(const std::vector<DcpFileHeader>& files);

// fsdp's manifest of a checkpoint in this layout (kDcpManifestName in the checkpoint
// directory, beside model/ and optim/): what DCP's layout has no room for. Readers of DCP's
// layout ignore it (it is no .safetensors file), and a checkpoint without it (one FSDP2 wrote)
// still loads.
inline constexpr char kDcpManifestName[] = "fsdp.json";
inline constexpr int kDcpManifestVersion = 1;
// The two DCP checkpoint directories inside ours: the model's parameters, and the AdamW state.
inline constexpr char kDcpModelDir[] = "model";
inline constexpr char kDcpOptimDir[] = "optim";

struct DcpFileRecord {
  std::string path;  // relative to the checkpoint directory: "model/<file>" or "optim/<file>"
  uint64_t bytes = 0;
};

struct DcpManifest {
  int world_size = 1;  // of the run that saved it
  int64_t step = 0;
  std::vector<DcpFileRecord> files;             // every .safetensors file of the checkpoint
  std::vector<std::string> rng_states;          // per rank (raw bytes); may be empty
  std::string user_json = "{}";                 // the caller's JSON object (re-serialized)
  std::optional<GradScalerRecord> grad_scaler;  // absent unless the run had one
};

// Serializes a manifest as JSON with a checksum of its own content.
std::string serialize_dcp_manifest(const DcpManifest& manifest);

// Parses and validates a manifest: format name and version, world size in [1, kMaxWorldSize],
// distinct file paths "model/<name>.safetensors" or "optim/<name>.safetensors" (no other
// directory, no "..", no further "/"), the gradient scaler's and RNG states' ranges as in the
// index, and (verify_checksum) its own checksum. Throws FormatError.
DcpManifest parse_dcp_manifest(std::string_view text, bool verify_checksum = true);

}  // namespace fsdp::checkpoint
