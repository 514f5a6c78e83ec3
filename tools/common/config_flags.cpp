// ConfigFlags: see config_flags.h and [Note: one set of allowed values for flags and files].
#include <common/config_flags.h>

#include <common/cli_checks.h>

#include <toml++/toml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <sstream>
#include <stdexcept>

namespace fsdp::tools {

std::string exact_text(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof(buffer), v);
  return std::string(buffer, result.ptr);
}

std::string ConfigFlags::error_text(const std::exception& e) {
  // LibTorch's errors (TORCH_CHECK in a parse function) end with where they were raised.
  std::string text = e.what();
  const auto where = text.find("\nException raised from");
  return where == std::string::npos ? text : text.substr(0, where);
}

CLI::Option* ConfigFlags::flag(const std::string& section, const std::string& names, bool& value,
                               const std::string& help) {
  CLI::Option* option = app_.add_flag(names, value, help);
  add(section, option, TomlKind::kBool,
      [&value]() -> std::optional<std::string> { return value ? "true" : "false"; });
  return option;
}

void ConfigFlags::add(const std::string& section, CLI::Option* option, TomlKind kind,
                      std::function<std::optional<std::string>()> text) {
  std::string key = option->get_lnames().front();
  for (char& c : key) c = c == '-' ? '_' : c;
  // --help lists the settings by section, under the name a --config file gives the section.
  option->group("[" + section + "] settings");
  std::optional<std::string> unset;
  if (kind == TomlKind::kString) unset = "";
  flags_.push_back({section, key, kind, option, std::move(text), unset});
}

void ConfigFlags::set_key(CLI::Option* option, const std::string& key) {
  for (auto& f : flags_) {
    if (f.option == option) f.key = key;
  }
}

void ConfigFlags::unset_when(CLI::Option* option, const std::string& text) {
  for (auto& f : flags_) {
    if (f.option == option) f.unset_text = text;
  }
}

void ConfigFlags::add_config_options() {
  app_.add_option("--config", config_path_,
                  "Read settings from this TOML file (sections and keys as --print-config "
                  "writes them); flags on the command line override it")
      ->check(existing_file());
  app_.add_flag("--print-config", print_config_,
                "Print the effective settings as TOML (a file --config reads back) and exit");
}

namespace {

// The value of --config in args ("--config F" or "--config=F"); "" when absent.
std::string config_path_in(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--config" && i + 1 < args.size()) return args[i + 1];
    if (args[i].rfind("--config=", 0) == 0) return args[i].substr(9);
  }
  return "";
}

// Whether args name the option (by any of its names, with or without "=value").
bool given(const CLI::Option& option, const std::vector<std::string>& args) {
  for (const std::string& arg : args) {
    if (arg.rfind("--", 0) != 0) continue;
    const std::string name = arg.substr(0, arg.find('='));
    if (option.check_name(name)) return true;
  }
  return false;
}

const char* kind_name(TomlKind kind) {
  switch (kind) {
    case TomlKind::kInteger:
      return "an integer";
    case TomlKind::kFloat:
      return "a number";
    case TomlKind::kBool:
      return "true or false";
    case TomlKind::kString:
      return "a string";
  }
  return "?";
}

// The text the flag takes for node, or throws naming where when node is not of kind.
std::string flag_text(const toml::node& node, TomlKind kind, const std::string& where) {
  if (kind == TomlKind::kInteger && node.is_integer())
    return std::to_string(*node.value<int64_t>());
  if (kind == TomlKind::kFloat && node.is_floating_point()) {
    return exact_text(*node.value<double>());
  }
  if (kind == TomlKind::kFloat && node.is_integer()) return std::to_string(*node.value<int64_t>());
  if (kind == TomlKind::kBool && node.is_boolean()) return *node.value<bool>() ? "true" : "false";
  if (kind == TomlKind::kString && node.is_string()) return *node.value<std::string>();
  std::ostringstream got;
  got << node.type();
  throw std::invalid_argument(where + " must be " + kind_name(kind) + ", got " + got.str());
}

std::string known_keys(const std::vector<ConfigFlag>& flags, const std::string& section) {
  std::string out;
  for (const auto& f : flags) {
    if (f.section == section) out += (out.empty() ? "" : ", ") + f.key;
  }
  return out;
}

// The parsed file, or throws naming the line and column of its syntax error.
toml::table parse_config_file(const std::string& path) {
  std::string checked = path;
  const std::string problem = existing_file()(checked);
  if (!problem.empty()) throw std::invalid_argument("--config: " + problem);
  try {
    return toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    std::ostringstream out;
    out << "--config " << path << ": line " << e.source().begin.line << ", column "
        << e.source().begin.column << ": " << e.description();
    throw std::invalid_argument(out.str());
  }
}

// "model, training, ...": the sections, in the order their first flag was defined.
std::string section_list(const std::vector<ConfigFlag>& flags) {
  std::vector<std::string> names;
  for (const auto& f : flags) {
    if (std::find(names.begin(), names.end(), f.section) == names.end()) names.push_back(f.section);
  }
  std::string out;
  for (const auto& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

// Finds the flag a file's [section] key sets; null for a key the program ignores; throws
// naming the key and the keys its section has when it is neither.
const ConfigFlag* flag_for_key(const std::vector<ConfigFlag>& flags,
                               const std::vector<std::string>& ignored, const std::string& section,
                               const std::string& key, const std::string& where) {
  for (const auto& f : flags) {
    if (f.section == section && f.key == key) return &f;
  }
  if (std::find(ignored.begin(), ignored.end(), section + "." + key) != ignored.end()) {
    return nullptr;
  }
  const std::string known = known_keys(flags, section);
  throw std::invalid_argument(where + " is not a setting" +
                              (known.empty() ? "; the sections are " + section_list(flags)
                                             : "; [" + section + "] has " + known));
}

}  // namespace

std::vector<std::string> ConfigFlags::file_args(const std::vector<std::string>& args) const {
  const std::string path = config_path_in(args);
  if (path.empty()) return {};
  const toml::table file = parse_config_file(path);
  const std::string here = "--config " + path + ": ";
  std::vector<std::string> out;
  for (const auto& [section_key, section_node] : file) {
    const std::string section(section_key.str());
    if (!section_node.is_table()) {
      throw std::invalid_argument(here + "'" + section + "' is not a [section]; the sections are " +
                                  section_list(flags_));
    }
    for (const auto& [key_node, value] : *section_node.as_table()) {
      const std::string key(key_node.str());
      const std::string where = here + "[" + section + "] " + key;
      const ConfigFlag* f = flag_for_key(flags_, ignored_, section, key, where);
      if (f == nullptr) continue;
      const std::string text = flag_text(value, f->kind, where);
      if (given(*f->option, args)) continue;  // the command line overrides the file
      if (f->unset_text == text) continue;
      out.push_back("--" + f->option->get_lnames().front() + "=" + text);
    }
  }
  return out;
}

std::string ConfigFlags::to_toml() const {
  std::ostringstream out;
  std::string section;
  for (const auto& f : flags_) {
    if (f.section != section) {
      out << (section.empty() ? "" : "\n") << "[" << f.section << "]\n";
      section = f.section;
    }
    const std::optional<std::string> text = f.text();
    if (!text.has_value() || text == f.unset_text) {
      out << "# " << f.key << " is unset\n";
    } else if (f.kind == TomlKind::kString) {
      out << f.key << " = " << toml::value<std::string>(*text) << "\n";
    } else if (f.kind == TomlKind::kFloat && text->find_first_of(".eEin") == std::string::npos) {
      out << f.key << " = " << *text << ".0\n";  // "65536" would read back as an integer
    } else {
      out << f.key << " = " << *text << "\n";
    }
  }
  return out.str();
}

}  // namespace fsdp::tools
