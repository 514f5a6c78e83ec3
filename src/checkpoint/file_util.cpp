// See file_util.h. Every system call's failure becomes a c10::Error naming the operation, the
// path and the system's reason.
#include "checkpoint/file_util.h"

#include <c10/util/Exception.h>

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

namespace fsdp::checkpoint::detail {

std::string system_error(const char* op, const std::string& path) {
  return std::string(op) + " '" + path + "': " + std::strerror(errno);
}

File File::open_read(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TORCH_CHECK(fd >= 0, system_error("cannot open", path));
  return File(fd, path);
}

File File::create(const std::string& path, bool direct) {
  if (direct) {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_DIRECT, 0644);
    if (fd >= 0) return File(fd, path, true);
    // tmpfs and some others refuse O_DIRECT with EINVAL: write through the page cache there.
    TORCH_CHECK(errno == EINVAL, system_error("cannot create", path));
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TORCH_CHECK(fd >= 0, system_error("cannot create", path));
  return File(fd, path);
}

File File::open_write(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  TORCH_CHECK(fd >= 0, system_error("cannot open for writing", path));
  return File(fd, path);
}

File::File(File&& other) noexcept
    : fd_(other.fd_), path_(std::move(other.path_)), direct_(other.direct_) {
  other.fd_ = -1;
}

File& File::operator=(File&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.fd_;
    path_ = std::move(other.path_);
    direct_ = other.direct_;
    other.fd_ = -1;
  }
  return *this;
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

uint64_t File::size() const {
  struct stat st;
  TORCH_CHECK(::fstat(fd_, &st) == 0, system_error("cannot stat", path_));
  TORCH_CHECK(S_ISREG(st.st_mode), "'", path_, "' is not a regular file");
  return static_cast<uint64_t>(st.st_size);
}

void File::pread_all(void* dst, size_t n, uint64_t offset) const {
  auto* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t got = ::pread(fd_, p, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    TORCH_CHECK(got >= 0, system_error("cannot read", path_));
    TORCH_CHECK(got > 0, "'", path_, "' ended at byte ", offset, " while ", n,
                " more bytes were expected (was it truncated while being read?)");
    p += got;
    n -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
}

void File::pwrite_all(const void* src, size_t n, uint64_t offset) {
  const auto* p = static_cast<const char*>(src);
  while (n > 0) {
    const ssize_t put = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
    if (put < 0 && errno == EINTR) continue;
    TORCH_CHECK(put > 0, system_error("cannot write", path_), " (at byte ", offset, ", ", n,
                " bytes still to write", errno == ENOSPC ? "; the file system is full" : "", ")");
    p += put;
    n -= static_cast<size_t>(put);
    offset += static_cast<uint64_t>(put);
  }
}

void File::start_writeback(uint64_t offset, size_t n) {
#ifdef __linux__
  // Only a hint: errors surface in sync().
  (void)::sync_file_range(fd_, static_cast<off_t>(offset), static_cast<off_t>(n),
                          SYNC_FILE_RANGE_WRITE);
#endif
}

void File::sync() { TORCH_CHECK(::fsync(fd_) == 0, system_error("cannot fsync", path_)); }

void File::truncate(uint64_t size) {
  TORCH_CHECK(::ftruncate(fd_, static_cast<off_t>(size)) == 0,
              system_error("cannot truncate", path_));
}

void File::close() {
  if (fd_ < 0) return;
  const int fd = fd_;
  fd_ = -1;
  TORCH_CHECK(::close(fd) == 0, system_error("cannot close", path_));
}

bool path_exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

bool is_directory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void make_directories(const std::string& path) {
  if (path.empty() || is_directory(path)) return;
  const std::string parent = parent_directory(path);
  if (parent != path) make_directories(parent);
  if (::mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) {
    TORCH_CHECK(false, system_error("cannot create directory", path));
  }
  TORCH_CHECK(is_directory(path), "'", path, "' exists and is not a directory");
}

void remove_all(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    TORCH_CHECK(errno == ENOENT, system_error("cannot stat", path));
    return;
  }
  if (S_ISDIR(st.st_mode)) {
    DIR* dir = ::opendir(path.c_str());
    TORCH_CHECK(dir != nullptr, system_error("cannot list", path));
    std::vector<std::string> names;
    while (const dirent* e = ::readdir(dir)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(dir);
    for (const auto& name : names) remove_all(path + "/" + name);
    TORCH_CHECK(::rmdir(path.c_str()) == 0, system_error("cannot remove", path));
  } else {
    TORCH_CHECK(::unlink(path.c_str()) == 0, system_error("cannot remove", path));
  }
}

void fsync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  TORCH_CHECK(fd >= 0, system_error("cannot open directory", dir));
  const int rc = ::fsync(fd);
  const std::string error = rc == 0 ? "" : system_error("cannot fsync directory", dir);
  ::close(fd);
  TORCH_CHECK(rc == 0, error);
}

std::string parent_directory(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const auto slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return p.substr(0, slash);
}

void write_file_atomically(const std::string& path, std::string_view content,
                           const std::function<void()>& before_rename) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  try {
    File file = File::create(tmp);
    file.pwrite_all(content.data(), content.size(), 0);
    file.sync();
    file.close();
    if (before_rename) before_rename();
    TORCH_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, system_error("cannot rename", tmp));
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  fsync_directory(parent_directory(path));
}

std::string read_file(const std::string& path, uint64_t max_bytes) {
  File file = File::open_read(path);
  const uint64_t size = file.size();
  TORCH_CHECK(size <= max_bytes, "'", path, "' has ", size, " bytes, more than the ", max_bytes,
              " such a file may have");
  std::string content(static_cast<size_t>(size), '\0');
  file.pread_all(content.data(), content.size(), 0);
  return content;
}

void publish_directory(const std::string& from, const std::string& to) {
  if (!path_exists(to)) {
    TORCH_CHECK(::rename(from.c_str(), to.c_str()) == 0, system_error("cannot rename", from));
  } else {
    // Swap the two atomically, so a crash leaves either the old or the new directory at to.
    TORCH_CHECK(::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) == 0,
                system_error("cannot exchange", from) + " with '" + to + "'");
    remove_all(from);  // now the old directory
  }
  fsync_directory(parent_directory(to));
}

}  // namespace fsdp::checkpoint::detail
