// File helpers for tests, in POSIX calls: exists, list, read, write, copy, make and remove
// directories. Header-only and without LibTorch, so every test binary (and the fuzz targets) can
// use them.
//
// [Note: no std::filesystem near LibTorch]
// libtorch.so exports its own copy of 64 std::filesystem functions, built with another
// libstdc++. The dynamic linker binds a test binary's calls to them (libtorch.so comes before
// libstdc++ in the search order), and some crash when called from code built against Debian's
// libstdc++: std::filesystem::remove_all(path) jumps to address 0. Code that may be linked with
// LibTorch (anything in tests/support) therefore uses these instead (src/checkpoint/file_util.h
// says the same for the library).
#pragma once

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace fsdp::test {

inline bool exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

inline int64_t file_size(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : -1;
}

// The names in dir, without . and .., in the order readdir gives them.
inline std::vector<std::string> list_dir(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    ::closedir(d);
  }
  return names;
}

// Removes path and, for a directory, everything under it; a missing path is not an error.
inline void remove_all(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    for (const auto& name : list_dir(path)) remove_all(path + "/" + name);
    ::rmdir(path.c_str());
  } else {
    ::unlink(path.c_str());
  }
}

// mkdir -p: every missing directory of path (mode 0755). Returns whether path is a directory.
inline bool make_directories(const std::string& path) {
  for (size_t at = path.find('/', 1); at != std::string::npos; at = path.find('/', at + 1)) {
    ::mkdir(path.substr(0, at).c_str(), 0755);
  }
  ::mkdir(path.c_str(), 0755);
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Writes bytes to path; returns whether every byte was written.
inline bool write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  return static_cast<bool>(out);
}

// The system's temporary directory: $TMPDIR, else /tmp.
inline std::string temp_root() {
  const char* tmp = std::getenv("TMPDIR");
  return tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
}

}  // namespace fsdp::test
