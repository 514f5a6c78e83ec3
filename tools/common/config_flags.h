// The settings a program takes as flags, each also a key of a section of a TOML file:
// `--global-batch 16` is `[training] global_batch = 16`. A program defines each setting once,
// through ConfigFlags, which binds it to its typed value and records its section; then
//
//   fsdp-train --config job.toml --steps 10     the file's settings, flags overriding them
//   fsdp-train ... --print-config               the effective settings as TOML, then exit
//
// and the output of --print-config given back to --config runs the same job (the values print
// exactly: floats in their shortest round-trip form).
//
// [Note: one set of allowed values for flags and files] A file's value is turned into the text
// its flag would take and goes through the same CLI11 parse and validators, so a bad value is
// refused with the same message whichever way it came, and no setting has two parsers. What
// only a file can get wrong is refused naming the file, the section and the key: an unknown
// section or key, a value of the wrong TOML type, a nested table.
//
// No LibTorch here (fsdp_program): toml++ and CLI11 only.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace fsdp::tools {

// A setting's TOML type.
enum class TomlKind { kInteger, kFloat, kBool, kString };

struct ConfigFlag {
  std::string section;  // "training"
  std::string key;      // "global_batch": the flag's first long name, '-' written '_'
  TomlKind kind = TomlKind::kString;
  CLI::Option* option = nullptr;
  // The value now, as the flag's text would give it; nullopt for a setting left unset (it
  // prints as a comment).
  std::function<std::optional<std::string>()> text;
  // The text that means "unset" (a string setting's "", --nproc's 0): such a value prints as a
  // comment, and a file that gives it leaves the setting as it is.
  std::optional<std::string> unset_text;
};

// The shortest text that reads back as exactly v ("0.003", "1e-05", "inf", "65536").
std::string exact_text(double v);

class ConfigFlags {
 public:
  explicit ConfigFlags(CLI::App& app) : app_(app) {}

  // A number or a string, parsed by CLI11 into value.
  template <class T>
  CLI::Option* value(const std::string& section, const std::string& names, T& value,
                     const std::string& help) {
    CLI::Option* option = app_.add_option(names, value, help);
    add(section, option, kind_of<T>(), [&value] { return text_of(value); });
    return option;
  }

  // A boolean flag (`--quiet`, `--quiet=false`).
  CLI::Option* flag(const std::string& section, const std::string& names, bool& value,
                    const std::string& help);

  // A typed value written as text: parse turns the text into the value, throwing a message
  // that names the flag for a bad one (it is checked while parsing, as a validator); print
  // turns the value back. With `optional`, an unset value prints as a comment.
  template <class T>
  CLI::Option* typed(const std::string& section, const std::string& names, T& value,
                     std::function<T(const std::string&)> parse,
                     std::function<std::string(const T&)> print, const std::string& help) {
    CLI::Option* option = app_.add_option_function<std::string>(
        names, [&value, parse](const std::string& text) { value = parse(text); }, help);
    option->check(parsable(parse))->default_str(print(value));
    add(section, option, TomlKind::kString, [&value, print] { return print(value); });
    return option;
  }
  template <class T>
  CLI::Option* typed(const std::string& section, const std::string& names, std::optional<T>& value,
                     std::function<T(const std::string&)> parse,
                     std::function<std::string(const T&)> print, const std::string& help) {
    CLI::Option* option = app_.add_option_function<std::string>(
        names, [&value, parse](const std::string& text) { value = parse(text); }, help);
    option->check(parsable(parse));
    add(section, option, TomlKind::kString, [&value, print]() -> std::optional<std::string> {
      if (!value.has_value()) return std::nullopt;
      return print(*value);
    });
    return option;
  }

  // Declares the text that leaves option's setting unset (see ConfigFlag::unset_text).
  void unset_when(CLI::Option* option, const std::string& text);
  // Gives option's setting another key than its flag's name.
  void set_key(CLI::Option* option, const std::string& key);
  // Keys a file may hold that this program takes no flag for (another program's settings of
  // the same job): read and left alone. Each "section.key".
  void ignore_keys(const std::vector<std::string>& keys) {
    ignored_.insert(ignored_.end(), keys.begin(), keys.end());
  }

  // --config FILE and --print-config.
  void add_config_options();
  bool print_config_asked() const { return print_config_; }

  // The arguments the settings of --config's file stand for, leaving out those that args (the
  // command line) gives itself; {} without --config. Throws naming the file, section and key.
  std::vector<std::string> file_args(const std::vector<std::string>& args) const;
  // The settings' values now, as TOML, section by section in the order they were defined.
  std::string to_toml() const;

  const std::vector<ConfigFlag>& flags() const { return flags_; }

 private:
  template <class T>
  static TomlKind kind_of() {
    if constexpr (std::is_same_v<T, std::string>) {
      return TomlKind::kString;
    } else if constexpr (std::is_floating_point_v<T>) {
      return TomlKind::kFloat;
    } else {
      static_assert(std::is_integral_v<T>, "a setting is a number, a string or typed()");
      return TomlKind::kInteger;
    }
  }
  template <class T>
  static std::optional<std::string> text_of(const T& v) {
    if constexpr (std::is_same_v<T, std::string>) {
      return v;
    } else if constexpr (std::is_floating_point_v<T>) {
      return exact_text(static_cast<double>(v));
    } else {
      return std::to_string(v);
    }
  }
  template <class T>
  static CLI::Validator parsable(std::function<T(const std::string&)> parse) {
    return CLI::Validator(
        [parse](std::string& text) -> std::string {
          try {
            parse(text);
          } catch (const std::exception& e) {
            return error_text(e);
          }
          return "";
        },
        "");
  }
  static std::string error_text(const std::exception& e);

  void add(const std::string& section, CLI::Option* option, TomlKind kind,
           std::function<std::optional<std::string>()> text);

  CLI::App& app_;
  std::vector<ConfigFlag> flags_;
  std::vector<std::string> ignored_;
  std::string config_path_;
  bool print_config_ = false;
};

}  // namespace fsdp::tools
