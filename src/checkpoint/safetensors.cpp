// safetensors reader and writer over LibTorch tensors.
//
// The reader trusts nothing but the validated header (format.cpp): every read is bounded by an
// entry's byte range, which lies inside the file, and by the destination tensor's byte size,
// which is checked against what is read. The writer's header is final in size from the start:
// checksums it embeds are 16-digit placeholders until finish() patches them in place.
#include <fsdp/checkpoint/safetensors.h>

#include "checkpoint/checksum.h"
#include "checkpoint/file_util.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <unistd.h>
#include <csignal>
#include <cstdlib>
#include <cstring>

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors stores little-endian data; a big-endian host would need byte swaps");

namespace fsdp::checkpoint {
namespace {

constexpr char kDataChecksumKey[] = "fsdp.xxh3_64";
constexpr char kTensorChecksumPrefix[] = "fsdp.xxh3_64:";
const std::string kPlaceholder(16, '0');
// Writes go out in pieces of this size, each handed to the kernel's writeback at once.
constexpr size_t kWriteChunk = 16 << 20;
// Data is hashed and copied in pieces of this size (fits in the last-level cache).
constexpr uint64_t kHashChunk = 1 << 20;

void check_cpu_contiguous(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.defined() && t.device().is_cpu() && t.is_contiguous(), what,
              " must be a contiguous CPU tensor");
}

}  // namespace

namespace {

// Each safetensors dtype and the LibTorch type it reads into, one row each.
constexpr std::pair<Dtype, at::ScalarType> kDtypeTypes[] = {
    {Dtype::kBool, at::kBool},
    {Dtype::kU8, at::kByte},
    {Dtype::kI8, at::kChar},
    {Dtype::kU16, at::kUInt16},
    {Dtype::kI16, at::kShort},
    {Dtype::kF16, at::kHalf},
    {Dtype::kBF16, at::kBFloat16},
    {Dtype::kU32, at::kUInt32},
    {Dtype::kI32, at::kInt},
    {Dtype::kF32, at::kFloat},
    {Dtype::kU64, at::kUInt64},
    {Dtype::kI64, at::kLong},
    {Dtype::kF64, at::kDouble},
    {Dtype::kF8E4M3, at::kFloat8_e4m3fn},
    {Dtype::kF8E5M2, at::kFloat8_e5m2},
};

}  // namespace

at::ScalarType to_scalar_type(Dtype dtype) {
  for (const auto& [d, type] : kDtypeTypes) {
    if (d == dtype) return type;
  }
  TORCH_CHECK(false, "unknown safetensors dtype ", static_cast<int>(dtype));
}

Dtype to_dtype(at::ScalarType type) {
  for (const auto& [d, t] : kDtypeTypes) {
    if (t == type) return d;
  }
  TORCH_CHECK(false, "safetensors has no dtype for ", type);
}

// --- reader ---

SafetensorsReader::SafetensorsReader(const std::string& path)
    : file_(std::make_unique<detail::File>(detail::File::open_read(path))) {
  const uint64_t size = file_->size();
  TORCH_CHECK(size >= 8, "'", path, "' is not a safetensors file: it has ", size,
              " bytes, fewer than the 8-byte header length");
  uint8_t prefix[8];
  file_->pread_all(prefix, 8, 0);
  const uint64_t n = decode_header_length(prefix);
  TORCH_CHECK(n <= kMaxHeaderBytes && n <= size - 8, "'", path,
              "' is not a valid safetensors file: its header length ", n,
              (n > kMaxHeaderBytes ? " exceeds the limit of " + std::to_string(kMaxHeaderBytes)
                                   : " does not fit in its " + std::to_string(size) + " bytes"));
  std::string json(static_cast<size_t>(n), '\0');
  file_->pread_all(json.data(), json.size(), 8);
  try {
    header_ = parse_safetensors_header(json, size);
  } catch (const FormatError& e) {
    TORCH_CHECK(false, "'", path, "' is not a valid safetensors file: ", e.what());
  }
  for (size_t i = 0; i < header_.entries.size(); ++i) by_name_[header_.entries[i].name] = i;
}

SafetensorsReader::~SafetensorsReader() = default;
SafetensorsReader::SafetensorsReader(SafetensorsReader&&) noexcept = default;
SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&&) noexcept = default;

const std::string& SafetensorsReader::path() const { return file_->path(); }

const TensorEntry& SafetensorsReader::entry(const std::string& name) const {
  auto it = by_name_.find(name);
  TORCH_CHECK(it != by_name_.end(), "'", path(), "' has no tensor '", name, "'");
  return header_.entries[it->second];
}

std::optional<uint64_t> SafetensorsReader::stored_checksum(const std::string& name) const {
  auto it = header_.metadata.find(kTensorChecksumPrefix + name);
  if (it == header_.metadata.end()) return std::nullopt;
  auto sum = parse_checksum_hex(it->second);
  TORCH_CHECK(sum.has_value(), "'", path(), "' stores a malformed checksum for '", name, "': '",
              it->second.substr(0, 40), "'");
  return sum;
}

at::Tensor SafetensorsReader::read(const std::string& name) const {
  const TensorEntry& e = entry(name);
  at::Tensor t = at::empty(e.shape, at::TensorOptions().dtype(to_scalar_type(e.dtype)));
  read_into(e, t);
  return t;
}

uint64_t SafetensorsReader::read_into(const TensorEntry& e, const at::Tensor& dst) const {
  check_cpu_contiguous(dst, "read_into's destination");
  TORCH_CHECK(static_cast<uint64_t>(dst.nbytes()) == e.nbytes(), "reading '", e.name, "' of '",
              path(), "': the destination has ", dst.nbytes(), " bytes, the tensor ", e.nbytes());
  // Read and hash piece by piece, so the hash reads bytes still in the CPU's cache.
  auto* out = static_cast<char*>(dst.data_ptr());
  const uint64_t n = e.nbytes();
  uint64_t sum = 0;
  if (n <= kHashChunk) {
    file_->pread_all(out, n, header_.data_offset + e.begin);
    sum = detail::xxh3(out, n);
  } else {
    detail::Hasher hasher;
    for (uint64_t done = 0; done < n;) {
      const size_t len = static_cast<size_t>(std::min<uint64_t>(kHashChunk, n - done));
      file_->pread_all(out + done, len, header_.data_offset + e.begin + done);
      hasher.update(out + done, len);
      done += len;
    }
    sum = hasher.digest();
  }
  if (auto stored = stored_checksum(e.name)) {
    TORCH_CHECK(*stored == sum, "'", path(), "' is corrupted: tensor '", e.name, "' has checksum ",
                checksum_hex(sum), " but the file stores ", checksum_hex(*stored));
  }
  return sum;
}

void SafetensorsReader::read_rows(const TensorEntry& e, int64_t row, int64_t rows,
                                  const at::Tensor& dst) const {
  check_cpu_contiguous(dst, "read_rows's destination");
  const int64_t dim0 = e.shape.empty() ? 1 : e.shape[0];
  TORCH_CHECK(row >= 0 && rows >= 0 && row <= dim0 && rows <= dim0 - row, "rows [", row, ", ", row,
              " + ", rows, ") are outside the ", dim0, " rows of '", e.name, "' in '", path(), "'");
  const uint64_t row_bytes = dim0 == 0 ? 0 : e.nbytes() / static_cast<uint64_t>(dim0);
  const uint64_t n = row_bytes * static_cast<uint64_t>(rows);
  TORCH_CHECK(static_cast<uint64_t>(dst.nbytes()) == n, "reading rows of '", e.name,
              "': the destination has ", dst.nbytes(), " bytes, the rows ", n);
  file_->pread_all(dst.data_ptr(), n,
                   header_.data_offset + e.begin + row_bytes * static_cast<uint64_t>(row));
}

void SafetensorsReader::read_columns_transposed(const TensorEntry& e, int64_t col, int64_t cols,
                                                const at::Tensor& dst) const {
  check_cpu_contiguous(dst, "read_columns_transposed's destination");
  TORCH_CHECK(e.shape.size() == 2, "'", e.name, "' in '", path(), "' has shape ", e.shape,
              ", not 2-D, so it has no columns to read");
  const int64_t R = e.shape[0], C = e.shape[1];
  TORCH_CHECK(col >= 0 && cols >= 0 && col <= C && cols <= C - col, "columns [", col, ", ", col,
              " + ", cols, ") are outside the ", C, " columns of '", e.name, "'");
  const int64_t es = dtype_size(e.dtype);
  TORCH_CHECK(dst.nbytes() == static_cast<size_t>(R * cols * es), "reading columns of '", e.name,
              "': the destination has ", dst.nbytes(), " bytes, the columns ", R * cols * es);
  if (R == 0 || cols == 0) return;
  at::Tensor rows = at::empty({R, cols}, dst.options());
  auto* out = static_cast<char*>(rows.data_ptr());
  for (int64_t r = 0; r < R; ++r) {
    file_->pread_all(out + r * cols * es, static_cast<size_t>(cols * es),
                     header_.data_offset + e.begin + static_cast<uint64_t>((r * C + col) * es));
  }
  dst.view({cols, R}).copy_(rows.t());
}

bool SafetensorsReader::verify_data_checksum() const {
  auto it = header_.metadata.find(kDataChecksumKey);
  if (it == header_.metadata.end()) return false;
  auto stored = parse_checksum_hex(it->second);
  TORCH_CHECK(stored.has_value(), "'", path(), "' stores a malformed data checksum");
  detail::Hasher hasher;
  std::vector<char> buffer(8 << 20);
  for (uint64_t done = 0; done < header_.data_bytes;) {
    const size_t n =
        static_cast<size_t>(std::min<uint64_t>(buffer.size(), header_.data_bytes - done));
    file_->pread_all(buffer.data(), n, header_.data_offset + done);
    hasher.update(buffer.data(), n);
    done += n;
  }
  TORCH_CHECK(hasher.digest() == *stored, "'", path(), "' is corrupted: its data has checksum ",
              checksum_hex(hasher.digest()), " but the file stores ", checksum_hex(*stored));
  return true;
}

// --- writer ---

struct SafetensorsWriter::Hashers {
  detail::Hasher file;
  detail::Hasher data;
};

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<TensorEntry> entries,
                                     std::map<std::string, std::string> metadata,
                                     SafetensorsWriterOptions options)
    : entries_(std::move(entries)),
      metadata_(std::move(metadata)),
      options_(options),
      hashers_(std::make_unique<Hashers>()) {
  try {
    data_bytes_ = assign_offsets(entries_);
  } catch (const FormatError& e) {
    TORCH_CHECK(false, "cannot write '", path, "': ", e.what());
  }
  if (options_.embed_checksums) {
    metadata_[kDataChecksumKey] = kPlaceholder;
    for (const auto& e : entries_) metadata_[kTensorChecksumPrefix + e.name] = kPlaceholder;
  }
  std::string header;
  try {
    header = encode_safetensors_header(entries_, metadata_);
  } catch (const FormatError& e) {
    TORCH_CHECK(false, "cannot write '", path, "': ", e.what());
  }
  data_offset_ = header.size();
  path_ = path;
  // The kill hook needs a file cut at an exact byte: write it through the page cache.
  const bool direct = options_.direct_io && !options_.kill_after_bytes;
  file_ = std::make_unique<detail::File>(detail::File::create(path, direct));
  if (file_->is_direct()) {
    void* buffer = nullptr;
    TORCH_CHECK(::posix_memalign(&buffer, detail::kDirectAlign, kWriteChunk) == 0,
                "cannot allocate a ", kWriteChunk, "-byte write buffer for '", path, "'");
    staging_ = std::unique_ptr<char, void (*)(void*)>(static_cast<char*>(buffer), &std::free);
  }
  put(header.data(), header.size());
}

SafetensorsWriter::~SafetensorsWriter() = default;

void SafetensorsWriter::put(const void* data, size_t n) {
  hashers_->file.update(data, n);
  const auto* p = static_cast<const char*>(data);
  if (staging_) {
    while (n > 0) {
      const size_t len = std::min(n, kWriteChunk - staged_);
      std::memcpy(staging_.get() + staged_, p, len);
      staged_ += len;
      written_ += len;
      p += len;
      n -= len;
      if (staged_ == kWriteChunk) flush_staging(false);
    }
    return;
  }
  while (n > 0) {
    const size_t len = std::min(n, kWriteChunk);
    if (options_.kill_after_bytes && written_ + len >= *options_.kill_after_bytes) {
      file_->pwrite_all(p, static_cast<size_t>(*options_.kill_after_bytes - written_), written_);
      ::kill(::getpid(), SIGKILL);  // the test hook: die mid-write, as a crash would
    }
    file_->pwrite_all(p, len, written_);
    file_->start_writeback(written_, len);
    written_ += len;
    p += len;
    n -= len;
  }
}

uint64_t SafetensorsWriter::write(const at::Tensor& tensor) {
  TORCH_CHECK(next_ < entries_.size(), "writing '", file_->path(), "': all ", entries_.size(),
              " tensors were already written");
  const TensorEntry& e = entries_[next_];
  TORCH_CHECK(tensor.defined() && tensor.device().is_cpu(), "writing '", e.name,
              "': the tensor must be on the CPU");
  TORCH_CHECK(tensor.scalar_type() == to_scalar_type(e.dtype) && tensor.numel() == e.numel(),
              "writing '", e.name, "': expected ", e.numel(), " elements of ", dtype_name(e.dtype),
              ", got ", tensor.numel(), " of ", tensor.scalar_type());
  const at::Tensor c = tensor.contiguous();
  // Hash and copy piece by piece, while each piece is in the CPU's cache.
  const auto* p = static_cast<const char*>(c.const_data_ptr());
  const uint64_t n = e.nbytes();
  uint64_t sum = 0;
  if (n <= kHashChunk) {
    sum = detail::xxh3(p, n);
    hashers_->data.update(p, n);
    put(p, n);
  } else {
    detail::Hasher hasher;
    for (uint64_t done = 0; done < n;) {
      const size_t len = static_cast<size_t>(std::min<uint64_t>(kHashChunk, n - done));
      hasher.update(p + done, len);
      hashers_->data.update(p + done, len);
      put(p + done, len);
      done += len;
    }
    sum = hasher.digest();
  }
  checksums_.push_back(sum);
  ++next_;
  return sum;
}

void SafetensorsWriter::flush_staging(bool final) {
  if (staged_ == 0) return;
  size_t len = staged_;
  if (final) {
    len = (staged_ + detail::kDirectAlign - 1) / detail::kDirectAlign * detail::kDirectAlign;
    std::memset(staging_.get() + staged_, 0, len - staged_);
  }
  file_->pwrite_all(staging_.get(), len, flushed_);
  flushed_ += staged_;
  staged_ = 0;
}

void SafetensorsWriter::finish() {
  TORCH_CHECK(next_ == entries_.size(), "'", file_->path(), "': finish() after ", next_, " of ",
              entries_.size(), " tensors");
  if (staging_) {
    flush_staging(true);
    file_->truncate(written_);  // drop the last block's padding
    staging_.reset();
  }
  if (options_.embed_checksums) {
    metadata_[kDataChecksumKey] = checksum_hex(hashers_->data.digest());
    for (size_t i = 0; i < entries_.size(); ++i) {
      metadata_[kTensorChecksumPrefix + entries_[i].name] = checksum_hex(checksums_[i]);
    }
    const std::string header = encode_safetensors_header(entries_, metadata_);
    TORCH_INTERNAL_ASSERT(header.size() == data_offset_, "patched header changed size");
    if (file_->is_direct()) {
      // An unaligned write needs the page cache: patch through a second, buffered descriptor.
      detail::File patch = detail::File::open_write(path_);
      patch.pwrite_all(header.data(), header.size(), 0);
      patch.sync();
      patch.close();
    } else {
      file_->pwrite_all(header.data(), header.size(), 0);
    }
  }
  file_->sync();
  file_->close();
}

uint64_t SafetensorsWriter::file_checksum() const {
  TORCH_CHECK(!options_.embed_checksums,
              "file_checksum() is only known for writers without embed_checksums");
  return hashers_->file.digest();
}

void save_safetensors(const std::string& path,
                      const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<TensorEntry> entries;
  for (const auto& [name, t] : tensors) {
    TensorEntry e;
    e.name = name;
    e.dtype = to_dtype(t.scalar_type());
    e.shape = t.sizes().vec();
    entries.push_back(std::move(e));
  }
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  try {
    SafetensorsWriter writer(tmp, std::move(entries), metadata);
    for (const auto& item : tensors) writer.write(item.second.detach().cpu());
    writer.finish();
    TORCH_CHECK(::rename(tmp.c_str(), path.c_str()) == 0,
                detail::system_error("cannot rename", tmp));
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  detail::fsync_directory(detail::parent_directory(path));
}

std::map<std::string, at::Tensor> load_safetensors(const std::string& path) {
  SafetensorsReader reader(path);
  std::map<std::string, at::Tensor> result;
  for (const auto& e : reader.header().entries) result[e.name] = reader.read(e.name);
  return result;
}

}  // namespace fsdp::checkpoint
