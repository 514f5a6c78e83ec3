// Shared test helpers; see test_support.h. Nothing here may block without a bound: a helper
// that hangs turns one failing test into a stuck suite.
#include "support/test_support.h"

#include <fsdp/util/error.h>

#include <c10/util/Exception.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>

namespace fsdp::test {
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
