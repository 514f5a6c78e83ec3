// libFuzzer target: encoding arbitrary bytes with byte-level BPE tokenizers built in code
// (GPT-2's ByteLevel regex, or Llama 3's Split regex, chosen by the first byte). Encoding must
// never throw, every id must be a token, and decode(encode(x)) must give x back after the
// invalid-UTF-8 replacement: byte-level BPE loses nothing.
#include <fsdp/data/tokenizer.h>

#include "support/data_util.h"

#include <cstddef>
#include <cstdint>

namespace {
fsdp::data::Tokenizer make(bool llama) {
  nlohmann::json j = fsdp::test::tiny_tokenizer();
  if (llama) {
    j["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern",
            {{"Regex",
              "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
              "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
    j["model"]["ignore_merges"] = true;
  }
  return fsdp::data::Tokenizer::from_json(j.dump());
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static fsdp::data::Tokenizer gpt2 = make(false), llama = make(true);
  if (size == 0) return 0;
  fsdp::data::Tokenizer& t = data[0] & 1 ? llama : gpt2;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::vector<uint32_t> ids = t.encode(text);
  for (uint32_t id : ids) {
    if (id >= t.vocab_size()) __builtin_trap();
  }
  std::string fixed;
  const std::string_view expected = fsdp::data::replace_invalid_utf8(text, fixed) ? fixed : text;
  if (t.decode(ids) != expected) __builtin_trap();
  return 0;
}
