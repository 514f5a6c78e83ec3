// Shared test helpers; see test_support.h. Nothing here may block without a bound: a helper
// that hangs turns one failing test into a stuck suite.
#include "support/test_support.h"

#include <fsdp/util/error.h>

#include <c10/util/Exception.h>
#include <sys/wait.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <thread>

namespace fsdp::test {

CommandResult run_command(const std::string& command, int limit_s) {
  const std::string cmd = "timeout -s KILL " + std::to_string(limit_s) + " " + command + " 2>&1";
  CommandResult r;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) {
    r.output = "cannot start: " + cmd;
    return r;
  }
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) r.output.append(buf, n);
  const int status = ::pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

std::string program_path(const std::string& name) {
  const char* dir = std::getenv("FSDP_BIN_DIR");
  return (dir != nullptr && *dir != '\0' ? std::string(dir) : std::string(".")) + "/" + name;
}

std::string reference_python() {
  const char* from_env = std::getenv("FSDP_PYTHON");
  const std::string python = from_env != nullptr && *from_env != '\0' ? from_env : FSDP_PYTHON;
  TORCH_CHECK(!python.empty() && python.front() == '/', "the reference python '", python,
              "' (FSDP_PYTHON, or CMake's -DFSDP_PYTHON) is not an absolute path; ctest runs "
              "tests from the build directory, so give e.g. $PWD/.venv/bin/python3");
  return python;
}

std::vector<nlohmann::json> read_json_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  std::string line;
  while (std::getline(in, line)) lines.push_back(nlohmann::json::parse(line));
  return lines;
}
ProcessGroupOptions test_options(std::chrono::milliseconds timeout) {
  ProcessGroupOptions options;
  options.timeout = timeout;
  return options;
}

std::vector<std::string> run_threads(int n, const std::function<void(int)>& fn) {
  std::vector<std::string> errors(n);
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      try {
        fn(i);
      } catch (...) {
        errors[i] = fsdp::error_message(std::current_exception());
        if (errors[i].empty()) {
          errors[i] = "(exception with an empty message)";
        }
      }
    });
  }
  for (auto& thread : threads) {
    thread.join();
  }
  return errors;
}

std::string error_message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (...) {
    return fsdp::error_message(std::current_exception());
  }
  return "";
}

ScopedEnv::ScopedEnv(std::vector<std::pair<std::string, std::optional<std::string>>> values) {
  for (auto& [name, value] : values) {
    const char* old = std::getenv(name.c_str());
    saved_.emplace_back(name, old ? std::optional<std::string>(old) : std::nullopt);
    if (value) {
      ::setenv(name.c_str(), value->c_str(), 1);
    } else {
      ::unsetenv(name.c_str());
    }
  }
}

ScopedEnv::~ScopedEnv() {
  for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) {
    if (it->second) {
      ::setenv(it->first.c_str(), it->second->c_str(), 1);
    } else {
      ::unsetenv(it->first.c_str());
    }
  }
}

}  // namespace fsdp::test
