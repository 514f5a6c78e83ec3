// POSIX file plumbing for checkpoints: an RAII file with whole-buffer pread/pwrite that fail
// loudly (path, operation, errno text), and the fsync + rename steps that make a write atomic.
//
// Crash safety rests on three POSIX facts: rename(2) within a filesystem atomically replaces
// its target; data and directory entries survive a crash only once fsync'd (the file, then its
// directory); and renameat2(RENAME_EXCHANGE) swaps two directories atomically, which is how a
// checkpoint directory that already exists is replaced.
//
// No std::filesystem here or anywhere near LibTorch: libtorch.so exports its own copy of some
// std::filesystem functions (remove_all, ...), which the dynamic linker binds our calls to, and
// which crash when called from code built against the system's libstdc++.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace fsdp::checkpoint::detail {

class File {
 public:
  static File open_read(const std::string& path);
  // Creates or truncates path for writing (mode 0644). With direct, the file is opened with
  // O_DIRECT when the filesystem allows it (see is_direct()): writes then skip the page cache
  // and must be whole, kDirectAlign-aligned blocks from kDirectAlign-aligned memory.
  static File create(const std::string& path, bool direct = false);
  // Opens an existing file for buffered writing, without truncating it.
  static File open_write(const std::string& path);

  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File();

  const std::string& path() const { return path_; }
  uint64_t size() const;
  // Reads exactly n bytes at offset; a short read (the file shrank) throws.
  void pread_all(void* dst, size_t n, uint64_t offset) const;
  void pwrite_all(const void* src, size_t n, uint64_t offset);
  // Asks the kernel to start writing [offset, offset + n) to disk now, without waiting
  // (Linux's sync_file_range; elsewhere a no-op). A writer that does this after each chunk
  // keeps the disk busy while it produces the next one, so its final sync() has little left
  // to do: with several processes writing at once, the difference on ext4 is several-fold.
  void start_writeback(uint64_t offset, size_t n);
  void sync();
  void truncate(uint64_t size);
  bool is_direct() const { return direct_; }
  // Closes and reports close(2)'s error, which can be a deferred write error.
  void close();

 private:
  File(int fd, std::string path, bool direct = false)
      : fd_(fd), path_(std::move(path)), direct_(direct) {}
  int fd_ = -1;
  std::string path_;
  bool direct_ = false;
};

// Alignment of O_DIRECT buffers, offsets and lengths (the largest common logical block size).
inline constexpr size_t kDirectAlign = 4096;

// "<op> '<path>': <strerror(errno)>".
std::string system_error(const char* op, const std::string& path);

bool path_exists(const std::string& path);
bool is_directory(const std::string& path);
void make_directories(const std::string& path);
void remove_all(const std::string& path);
void fsync_directory(const std::string& dir);
std::string parent_directory(const std::string& path);

// Writes content to path + ".tmp-<pid>", fsyncs it, renames it over path and fsyncs the
// directory: readers see the old file or the new one, never a mix. before_rename (optional) runs
// once the new content is durable, just before the rename (the crash tests use it).
void write_file_atomically(const std::string& path, std::string_view content,
                           const std::function<void()>& before_rename = nullptr);
// Reads a whole file of at most max_bytes; throws naming the path otherwise.
std::string read_file(const std::string& path, uint64_t max_bytes);

// Moves the finished directory from to path to, atomically replacing an existing one (which
// is then deleted), and fsyncs to's parent directory.
void publish_directory(const std::string& from, const std::string& to);

}  // namespace fsdp::checkpoint::detail
