// Command-line checks shared by the fsdp programs (fsdp-train, fsdp-estimate, ...), as CLI11
// validators, so that every value is checked while the command line is parsed, before any
// work starts, and the error names the flag and the value ("--timeout-s: -1 is not in
// (0, 1e+07]"). CLI11's own Range lets NaN through and its file checks do not say what is
// wrong with a path; these do.
#pragma once

#include <CLI/CLI.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace fsdp::tools {

// A finite real number in [min, max] (or (min, max] when open_min). Rejects nan and inf.
inline CLI::Validator finite_in(double min, double max, bool open_min = false) {
  const std::string range = (open_min ? "(" : "[") + CLI::detail::to_string(min) + ", " +
                            CLI::detail::to_string(max) + "]";
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        char* end = nullptr;
        errno = 0;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || *end != '\0') return "'" + text + "' is not a number";
        if (!std::isfinite(v) || errno == ERANGE) return text + " is not a finite number";
        if (v < min || v > max || (open_min && v == min)) return text + " is not in " + range;
        return "";
      },
      "finite in " + range);
}

// A whole number of at least min (and at most max): no fraction, exponent, sign trick or
// overflow ("-1" for an unsigned flag is refused, not wrapped around).
inline CLI::Validator integer_at_least(long long min, long long max = LLONG_MAX) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        char* end = nullptr;
        errno = 0;
        const long long v = std::strtoll(text.c_str(), &end, 10);
        if (text.empty() || *end != '\0') return "'" + text + "' is not a whole number";
        if (errno == ERANGE || v > max)
          return text + " is too large (at most " + std::to_string(max) + ")";
        if (v < min) return text + " is less than " + std::to_string(min);
        return "";
      },
      "INT >= " + std::to_string(min));
}

// A positive real number; inf is allowed (it means "no limit"), nan is not.
inline CLI::Validator positive_or_inf() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || *end != '\0') return "'" + text + "' is not a number";
        if (std::isnan(v) || !(v > 0)) return text + " is not a positive number";
        return "";
      },
      "positive");
}

namespace detail {

// "" if path exists with the wanted kind (S_IFREG or S_IFDIR), else what is wrong with it.
inline std::string path_problem(const std::string& path, mode_t kind) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return "'" + path + "': " + std::strerror(errno);
  if (kind == S_IFREG && S_ISDIR(st.st_mode)) return "'" + path + "' is a directory, not a file";
  if (kind == S_IFDIR && !S_ISDIR(st.st_mode)) return "'" + path + "' is not a directory";
  return "";
}

// "" if this process may create files in the directory dir, else why not (the system's reason:
// permissions, a read-only file system), so a run is refused before it trains rather than when
// it first writes.
inline std::string writable_problem(const std::string& dir) {
  if (::access(dir.c_str(), W_OK | X_OK) == 0) return "";
  return "'" + dir + "' is not writable: " + std::strerror(errno);
}

inline std::string parent_of(const std::string& path) {
  const auto slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

}  // namespace detail

// An existing file (not a directory) to read.
inline CLI::Validator existing_file() {
  return CLI::Validator([](std::string& p) { return detail::path_problem(p, S_IFREG); }, "FILE");
}

// An existing directory to read.
inline CLI::Validator existing_dir() {
  return CLI::Validator([](std::string& p) { return detail::path_problem(p, S_IFDIR); }, "DIR");
}

// Hugging Face weights to read: a safetensors file (or a sharded checkpoint's index), or a
// directory holding model.safetensors.index.json or model.safetensors, as save_pretrained
// writes them.
inline CLI::Validator hf_weights() {
  return CLI::Validator(
      [](std::string& p) -> std::string {
        struct stat st {};
        if (::stat(p.c_str(), &st) != 0) return "'" + p + "': " + std::strerror(errno);
        if (!S_ISDIR(st.st_mode)) return detail::path_problem(p, S_IFREG);
        for (const char* name : {"/model.safetensors.index.json", "/model.safetensors"}) {
          if (::stat((p + name).c_str(), &st) == 0) return "";
        }
        return "directory '" + p +
               "' holds neither model.safetensors.index.json nor model.safetensors";
      },
      "FILE|DIR");
}

// An existing file or directory to read (a file, or a directory of files).
inline CLI::Validator existing_path() {
  return CLI::Validator(
      [](std::string& p) -> std::string {
        struct stat st {};
        return ::stat(p.c_str(), &st) == 0 ? "" : "'" + p + "': " + std::strerror(errno);
      },
      "PATH");
}

namespace detail {

// "" if the directory dir exists, or (when created_with_parents) if the nearest existing
// ancestor of dir is a directory, so that dir can be created; else what is wrong.
inline std::string directory_problem(std::string dir, bool created_with_parents) {
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  struct stat st {};
  while (created_with_parents && dir != "." && dir != "/" && ::stat(dir.c_str(), &st) != 0 &&
         errno == ENOENT) {
    dir = parent_of(dir);
  }
  const std::string problem = path_problem(dir, S_IFDIR);
  return problem.empty() ? writable_problem(dir) : problem;
}

}  // namespace detail

// A file to write: not a directory, in a directory that exists (or, with
// created_with_parents, that the program creates with its missing parents).
inline CLI::Validator output_file(bool created_with_parents = false) {
  return CLI::Validator(
      [=](std::string& p) -> std::string {
        if (p.empty() || p.back() == '/') return "'" + p + "' names a directory, not a file";
        struct stat st {};
        if (::stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
          return "'" + p + "' is a directory, not a file";
        const std::string problem =
            detail::directory_problem(detail::parent_of(p), created_with_parents);
        return problem.empty() ? "" : "cannot write '" + p + "': " + problem;
      },
      "FILE");
}

// A directory to write into: an existing directory, or a path the program can create (its
// parent exists, or with created_with_parents its nearest existing ancestor is a directory).
inline CLI::Validator output_dir(bool created_with_parents = false) {
  return CLI::Validator(
      [=](std::string& p) -> std::string {
        if (p.empty()) return "an empty path is not a directory";
        struct stat st {};
        if (::stat(p.c_str(), &st) == 0) {
          return S_ISDIR(st.st_mode) ? detail::writable_problem(p)
                                     : "'" + p + "' exists and is not a directory";
        }
        std::string trimmed = p;
        while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
        const std::string problem =
            detail::directory_problem(detail::parent_of(trimmed), created_with_parents);
        return problem.empty() ? "" : "cannot create '" + p + "': " + problem;
      },
      "DIR");
}

}  // namespace fsdp::tools
