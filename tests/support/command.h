// Shell commands from tests, with a time limit. No LibTorch: the data tests use it too.
#pragma once

#include <string>

namespace fsdp::test {

// What a shell command printed (stdout and stderr, interleaved) and its exit status (128 + the
// signal's number if a signal ended it).
struct CommandResult {
  int exit_code = -1;
  std::string output;
};

// Runs command through the shell, killed after limit_s seconds so that a hang fails the test
// instead of stalling the suite.
CommandResult run_command(const std::string& command, int limit_s = 240);

}  // namespace fsdp::test
