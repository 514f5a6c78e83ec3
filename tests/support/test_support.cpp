// Shared test helpers; see test_support.h. Nothing here may block without a bound: a helper
// that hangs turns one failing test into a stuck suite.
#include "support/test_support.h"

#include <arpa/inet.h>
#include <c10/util/Exception.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <thread>

namespace fsdp::test {
namespace {

std::string describe(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

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
        errors[i] = describe(std::current_exception());
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
    return describe(std::current_exception());
  }
  return "";
}

int free_tcp_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  TORCH_CHECK(fd >= 0, "free_tcp_port: socket() failed: ", std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  const int saved_errno = errno;
  ::close(fd);
  TORCH_CHECK(ok, "free_tcp_port: bind/getsockname failed: ", std::strerror(saved_errno));
  return ntohs(addr.sin_port);
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
