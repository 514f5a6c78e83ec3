// A program's command line as a library piece: its flags bound to typed options, the checks
// that involve several flags, and the work. Every program's main() is run_program(), and the
// flag catalogue (tests/tools/test_flag_catalogue.cpp) calls parse_and_check() in process, so
// the message a test sees for a bad flag is the message a user sees, without starting a process
// per case. No LibTorch here: fsdp-tokenize does not link it.
#pragma once

#include <common/config_flags.h>

#include <CLI/CLI.hpp>

#include <exception>
#include <string>
#include <vector>

namespace fsdp::tools {

class ProgramCli {
 public:
  virtual ~ProgramCli() = default;

  // "fsdp-train": the first word of every error line.
  virtual const char* name() const = 0;
  // The one line --help prints first.
  virtual const char* description() const = 0;
  // Defines every flag on app, bound to this object's options; values are checked while parsing.
  virtual void add_flags(CLI::App& app) = 0;
  // After parsing, before any work: what depends on several flags, files read only to be
  // checked. Throws, naming the flags, on a bad command line.
  virtual void check(const CLI::App& app) {}
  // The work. args: the command line after the program's name (for ranks it relaunches).
  // Returns the exit status; throws on an error.
  virtual int run(const CLI::App& app, const std::vector<std::string>& args) = 0;
  // The line printed for an error that check() or run() threw (without its newline).
  virtual std::string error_line(const std::exception& e) const;
  // A program whose add_flags() defines its settings through ConfigFlags returns them here
  // (valid until the next add_flags()); it then also takes --config FILE and --print-config.
  virtual ConfigFlags* config_flags() { return nullptr; }
};

// What every program's --version prints: "<program> <project version> (<commit>)", e.g.
// "fsdp-train 0.1.0 (55791ee-dirty)": CMake's project(VERSION) and `git describe --always
// --dirty` when the build was configured ("unknown" outside a git checkout).
std::string version_line(const std::string& program);

// main(): parses argv into cli (after --config's file, when the program takes one), checks,
// runs (or with --print-config prints the settings on stdout and returns 0). A parse error prints
// CLI11's message and returns its exit code (--help and --version print on stdout and return 0);
// an error thrown by check() or run() prints cli.error_line() on stderr and returns 1.
int run_program(ProgramCli& cli, int argc, char** argv);

// What run_program does before run(): the exit status and what it printed. A command line that
// passes gives {0, ""} (and --help its text, --version its line, with status 0).
struct CheckOutcome {
  int exit_code = 0;
  std::string output;
};
CheckOutcome parse_and_check(ProgramCli& cli, const std::vector<std::string>& args);

}  // namespace fsdp::tools
