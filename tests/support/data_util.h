// Helpers shared by the data tests: a tiny byte-level BPE tokenizer.json built in code (so most
// tests need no Python), temporary directories and file writing, a DataError's message.
#pragma once

#include <fsdp/data/error.h>
#include <fsdp/data/tokenizer.h>
#include <nlohmann/json.hpp>

#include "support/files.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>

namespace fsdp::test {

// GPT-2's byte -> char table, as UTF-8 strings.
inline std::string byte_char(int b) {
  int n = 0, cp = -1;
  for (int x = 0; x < 256; ++x) {
    const bool printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174;
    const int c = printable ? x : 256 + n++;
    if (x == b) cp = c;
  }
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

// A byte-level BPE tokenizer.json: the 256 byte tokens, merges "Ġ t", "h e", "Ġt he", then
// the special <|endoftext|> as the last id.
inline nlohmann::json tiny_tokenizer() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  const std::string sp = byte_char(' ');
  vocab[sp + "t"] = 256;
  vocab["he"] = 257;
  vocab[sp + "the"] = 258;
  nlohmann::json model = {{"type", "BPE"},
                          {"dropout", nullptr},
                          {"unk_token", nullptr},
                          {"continuing_subword_prefix", nullptr},
                          {"end_of_word_suffix", nullptr},
                          {"fuse_unk", false},
                          {"byte_fallback", false},
                          {"ignore_merges", false},
                          {"vocab", vocab}};
  model["merges"] = nlohmann::json::array({sp + " t", "h e", sp + "t he"});
  nlohmann::json added = nlohmann::json::array();
  added.push_back({{"id", 259},
                   {"content", "<|endoftext|>"},
                   {"single_word", false},
                   {"lstrip", false},
                   {"rstrip", false},
                   {"normalized", false},
                   {"special", true}});
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "ByteLevel"},
            {"add_prefix_space", false},
            {"trim_offsets", true},
            {"use_regex", true}}},
          {"post_processor", nullptr},
          {"decoder",
           {{"type", "ByteLevel"},
            {"add_prefix_space", true},
            {"trim_offsets", true},
            {"use_regex", true}}},
          {"model", model}};
}

// A fresh directory under the system's temp dir, removed with the object.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = temp_root() + "/fsdp_data_XXXXXX";
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() { remove_all(path_); }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out << bytes;
}

// tiny_tokenizer() as a Tokenizer, with config as its tokenizer_config.json (EOS by default).
inline data::Tokenizer tiny(const std::string& config = R"({"eos_token": "<|endoftext|>"})") {
  return data::Tokenizer::from_json(tiny_tokenizer().dump(), config, "tiny");
}

// The message of the DataError f throws, or "(no error)"; any other exception propagates.
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const data::DataError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace fsdp::test
