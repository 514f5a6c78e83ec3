// run_program and parse_and_check: one path through CLI11's parse and the checks, so the
// program and the in-process flag catalogue print the same thing.
#include <common/program.h>

#include <cstdio>
#include <iostream>
#include <sstream>

#ifndef FSDP_VERSION
#error "CMakeLists.txt defines FSDP_VERSION and FSDP_GIT_DESCRIBE for this file"
#endif

namespace fsdp::tools {

std::string version_line(const std::string& program) {
  return program + " " FSDP_VERSION " (" FSDP_GIT_DESCRIBE ")";
}

std::string ProgramCli::error_line(const std::exception& e) const {
  return std::string(name()) + ": error: " + e.what();
}

namespace {

// Parses args (after the program's name) into app; on CLI11's error (or --help) fills `outcome`
// with what CLI11_PARSE would print and return, and returns false.
bool parse(CLI::App& app, const std::vector<std::string>& args, CheckOutcome& outcome) {
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 takes them reversed
  try {
    app.parse(reversed);
    return true;
  } catch (const CLI::ParseError& e) {
    std::ostringstream out, err;
    outcome.exit_code = app.exit(e, out, err);
    outcome.output = out.str() + err.str();
    return false;
  }
}

// Calls fn; an exception becomes {1, cli.error_line(e) + "\n"}.
template <typename Fn>
CheckOutcome reporting(const ProgramCli& cli, Fn&& fn) {
  try {
    return {fn(), ""};
  } catch (const std::exception& e) {
    return {1, cli.error_line(e) + "\n"};
  }
}

// Defines cli's flags on app and parses args into it, after the settings of --config's file;
// false with outcome filled on an error or --help.
bool define_and_parse(ProgramCli& cli, CLI::App& app, const std::vector<std::string>& args,
                      CheckOutcome& outcome) {
  app.set_version_flag("--version", version_line(cli.name()),
                       "Print the program's version and commit, then exit");
  cli.add_flags(app);
  ConfigFlags* settings = cli.config_flags();
  if (settings == nullptr) return parse(app, args, outcome);
  settings->add_config_options();
  std::vector<std::string> all;
  outcome = reporting(cli, [&] {
    all = settings->file_args(args);
    return 0;
  });
  if (outcome.exit_code != 0) return false;
  all.insert(all.end(), args.begin(), args.end());
  return parse(app, all, outcome);
}

// --print-config: the settings, checked, on stdout.
bool printed_config(ProgramCli& cli) {
  ConfigFlags* settings = cli.config_flags();
  if (settings == nullptr || !settings->print_config_asked()) return false;
  std::fputs(settings->to_toml().c_str(), stdout);
  return true;
}

}  // namespace

int run_program(ProgramCli& cli, int argc, char** argv) {
  CLI::App app{cli.description()};
  const std::vector<std::string> args(argv + 1, argv + argc);
  CheckOutcome outcome;
  if (!define_and_parse(cli, app, args, outcome)) {
    // CLI11 prints --help's text and --version's line to stdout, errors to stderr.
    std::fputs(outcome.output.c_str(), outcome.exit_code == 0 ? stdout : stderr);
    return outcome.exit_code;
  }
  outcome = reporting(cli, [&] {
    cli.check(app);
    return printed_config(cli) ? 0 : cli.run(app, args);
  });
  std::fputs(outcome.output.c_str(), stderr);
  return outcome.exit_code;
}

CheckOutcome parse_and_check(ProgramCli& cli, const std::vector<std::string>& args) {
  CLI::App app{cli.description()};
  CheckOutcome outcome;
  if (!define_and_parse(cli, app, args, outcome)) return outcome;
  return reporting(cli, [&] {
    cli.check(app);
    return 0;
  });
}

}  // namespace fsdp::tools
