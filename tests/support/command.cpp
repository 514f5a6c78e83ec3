// run_command: popen with `timeout -s KILL`, so a hung child cannot outlive its limit.
#include "support/command.h"

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>

namespace fsdp::test {

CommandResult run_command(const std::string& command, int limit_s) {
  // ctest sets this for suites labelled quick: they promise to start no process (so that
  // `ctest -L quick` stays an edit loop of in-process tests). See
  // tests/cmake/discover_suites.cmake.
  if (const char* no = std::getenv("FSDP_TEST_NO_PROCESSES"); no != nullptr && *no == '1') {
    return {-1,
            "this suite is labelled quick, which promises to start no process (tests/"
            "CMakeLists.txt's FSDP_SUITE_LABEL_RULES): label it multiprocess, or do not run: " +
                command};
  }
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

}  // namespace fsdp::test
