// safetensors files with LibTorch tensors: a validating reader that reads only the bytes asked
// for, and a streaming writer that writes the header first and each tensor as it comes, so a
// caller never needs every tensor in memory at once. Formats: see format.h.
//
// Checksums. A writer created with embed_checksums stores the XXH3-64 of every tensor's bytes
// in __metadata__ under "fsdp.xxh3_64:<name>" and of the whole data section under
// "fsdp.xxh3_64"; the reader checks a tensor against its stored checksum whenever it reads the
// whole tensor (read(), read_into()). Files from other tools carry none and are read as is.
#pragma once

#include <fsdp/checkpoint/format.h>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::checkpoint {

// LibTorch's scalar type of a safetensors dtype and back. Throws for a type with no match.
at::ScalarType to_scalar_type(Dtype dtype);
Dtype to_dtype(at::ScalarType type);

namespace detail {
class File;
}

class SafetensorsReader {
 public:
  // Opens path and validates its header against the file's size (see
  // parse_safetensors_header). Throws naming path and the problem.
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(SafetensorsReader&&) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&&) noexcept;

  const std::string& path() const;
  const SafetensorsHeader& header() const { return header_; }
  // The entry called name; throws naming the file when it has none.
  const TensorEntry& entry(const std::string& name) const;
  // The checksum stored for name by a writer with embed_checksums, if any.
  std::optional<uint64_t> stored_checksum(const std::string& name) const;

  // The whole tensor, as a new CPU tensor of its dtype and shape. Verifies the stored checksum
  // when there is one.
  at::Tensor read(const std::string& name) const;
  // Reads the whole tensor into dst, a contiguous CPU tensor of the same byte size, and
  // returns the XXH3-64 of the bytes read. Verifies a stored checksum when there is one.
  uint64_t read_into(const TensorEntry& entry, const at::Tensor& dst) const;
  // Rows [row, row + rows) of the entry viewed as [shape[0], rest] into dst (contiguous, rows x
  // rest elements of the entry's dtype). A 0-D entry is one row. No checksum (a part).
  void read_rows(const TensorEntry& entry, int64_t row, int64_t rows, const at::Tensor& dst) const;
  // For a 2-D entry [R, C]: columns [col, col + cols) into dst laid out [cols, R] (that is, rows
  // of the transpose), with one read per row of the entry. No checksum (a part).
  void read_columns_transposed(const TensorEntry& entry, int64_t col, int64_t cols,
                               const at::Tensor& dst) const;
  // Reads every byte of the data section and checks it against the stored "fsdp.xxh3_64".
  // Returns false when the file stores no checksum; throws on a mismatch.
  bool verify_data_checksum() const;

 private:
  std::unique_ptr<detail::File> file_;
  SafetensorsHeader header_;
  std::map<std::string, size_t> by_name_;
};

struct SafetensorsWriterOptions {
  // Store per-tensor and whole-data checksums in __metadata__. (optional) defaults to true.
  bool embed_checksums = true;
  // Write with O_DIRECT where the filesystem allows it, through an aligned staging buffer:
  // no page-cache copy, and several processes writing at once keep the disk streaming
  // (buffered, they were 3x slower on ext4 here; see bench/RESULTS.md). The file is then not
  // in the page cache afterwards. (optional) defaults to true.
  bool direct_io = true;
  // Test hook: SIGKILL this process once this many bytes of the file are written. (optional)
  // defaults to never.
  std::optional<uint64_t> kill_after_bytes;
};

// Writes path (directly: callers make it atomic by writing to a temporary name and renaming).
// The entries' names, dtypes and shapes are fixed up front; write() then takes their data in
// that order.
class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::string& path, std::vector<TensorEntry> entries,
                    std::map<std::string, std::string> metadata,
                    SafetensorsWriterOptions options = {});
  ~SafetensorsWriter();

  // The next entry's data: a CPU tensor of its dtype and element count (made contiguous here if
  // it is not). Returns that entry's checksum.
  uint64_t write(const at::Tensor& tensor);
  // Checks that every entry was written, patches the checksums into the header, fsyncs and
  // closes.
  void finish();
  // XXH3-64 of the whole file as finish() left it. Only for writers without embed_checksums,
  // whose header is never patched (the hash streams with the writes).
  uint64_t file_checksum() const;

  uint64_t file_bytes() const { return data_offset_ + data_bytes_; }
  const std::vector<TensorEntry>& entries() const { return entries_; }

 private:
  void put(const void* data, size_t n);
  // Writes the staged bytes (all of them, padded to an aligned size, when final).
  void flush_staging(bool final);

  std::unique_ptr<detail::File> file_;
  std::string path_;
  std::unique_ptr<char, void (*)(void*)> staging_{nullptr, nullptr};  // O_DIRECT only
  size_t staged_ = 0;
  uint64_t flushed_ = 0;  // bytes of the file on disk (O_DIRECT only)
  std::vector<TensorEntry> entries_;
  std::map<std::string, std::string> metadata_;
  SafetensorsWriterOptions options_;
  std::vector<uint64_t> checksums_;
  size_t next_ = 0;
  uint64_t data_offset_ = 0;
  uint64_t data_bytes_ = 0;
  uint64_t written_ = 0;  // bytes of the file written so far
  struct Hashers;
  std::unique_ptr<Hashers> hashers_;
};

// Writes tensors (CPU, any layout) to path atomically (temporary file, fsync, rename).
void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata = {});
// Every tensor of path, checksums verified where stored.
std::map<std::string, at::Tensor> load_safetensors(const std::string& path);

}  // namespace fsdp::checkpoint
