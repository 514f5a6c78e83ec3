// The README documents every flag: each flag that a program's --help lists appears in README.md
// in backticks (`--flag` or `--flag VALUE`), and each flag of a README table row about a program
// exists in that program's --help, so neither can drift from the other.
#include "support/test_support.h"

#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#ifndef FSDP_SOURCE_DIR
#error "tests/CMakeLists.txt defines FSDP_SOURCE_DIR"
#endif

namespace fsdp::test {
namespace {

std::string readme() {
  std::ifstream in(FSDP_SOURCE_DIR "/README.md");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Every long flag in a program's --help.
std::set<std::string> help_flags(const std::string& program) {
  const CommandResult r = run_command(program_path(program) + " --help", 60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::set<std::string> flags;
  const std::regex flag(R"((^|[\s,])(--[a-z][a-z0-9-]*))");
  for (std::sregex_iterator it(r.output.begin(), r.output.end(), flag), end; it != end; ++it) {
    flags.insert((*it)[2]);
  }
  flags.erase("--help");
  return flags;
}

// The flags a README table documents for a program: the first cell of each row of the tables
// under the heading that names it.
std::set<std::string> table_flags(const std::string& text, const std::string& heading) {
  std::set<std::string> flags;
  const size_t start = text.find(heading);
  EXPECT_NE(start, std::string::npos) << "README.md has no '" << heading << "'";
  if (start == std::string::npos) return flags;
  const size_t end = text.find("\n## ", start + heading.size());
  std::istringstream section(text.substr(start, end - start));
  const std::regex row(R"(^\| `(--[a-z][a-z0-9-]*)[` ])");
  std::smatch m;
  for (std::string line; std::getline(section, line);) {
    if (std::regex_search(line, m, row)) flags.insert(m[1]);
  }
  return flags;
}

class ReadmeFlags : public ::testing::TestWithParam<std::string> {};

TEST_P(ReadmeFlags, EveryHelpFlagIsDocumented) {
  const std::string text = readme();
  const std::set<std::string> flags = help_flags(GetParam());
  EXPECT_GT(flags.size(), 2u) << GetParam() << " --help lists no flags";
  for (const auto& flag : flags) {
    const std::regex documented("`" + flag + "[` =]");
    EXPECT_TRUE(std::regex_search(text, documented))
        << GetParam() << " " << flag << " is in --help but not in README.md (as `" << flag << "`)";
  }
}

INSTANTIATE_TEST_SUITE_P(Programs, ReadmeFlags,
                         ::testing::Values("fsdp-train", "fsdp-estimate", "fsdp-tokenize",
                                           "fsdp-comm-bench"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) c = c == '-' ? '_' : c;
                           return name;
                         });

TEST(ReadmeFlagTables, EveryDocumentedFlagExists) {
  const std::string text = readme();
  const std::pair<const char*, const char*> sections[] = {
      {"fsdp-train", "## fsdp-train"},
      {"fsdp-tokenize", "fsdp-tokenize --"},
      {"fsdp-comm-bench", "## fsdp-comm-bench"}};
  for (const auto& [program, heading] : sections) {
    const std::set<std::string> documented = table_flags(text, heading);
    const std::set<std::string> real = help_flags(program);
    EXPECT_GT(documented.size(), 3u) << "no flag table found under '" << heading << "'";
    for (const auto& flag : documented) {
      EXPECT_EQ(real.count(flag), 1u)
          << "README.md documents " << program << " " << flag << ", which --help does not list";
    }
  }
}

}  // namespace
}  // namespace fsdp::test
