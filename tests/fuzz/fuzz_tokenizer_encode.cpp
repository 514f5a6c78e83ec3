// libFuzzer target: encoding arbitrary bytes with byte-level BPE tokenizers built in code
// (GPT-2's ByteLevel regex, Llama 3's Split regex, or that with Qwen2's NFC normalizer, chosen
// by the first byte). Encoding must never throw, every id must be a token, and
// decode(encode(x)) must give x back after the invalid-UTF-8 replacement (and NFC, for the
// normalizing one): byte-level BPE loses nothing.
#include <fsdp/data/tokenizer.h>

#include "data/normalize.h"

#include "support/data_util.h"

#include <cstddef>
#include <cstdint>

namespace {
fsdp::data::Tokenizer make(bool llama, bool nfc = false) {
  nlohmann::json j = fsdp::test::tiny_tokenizer();
  if (nfc) j["normalizer"] = {{"type", "NFC"}};
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
  static fsdp::data::Tokenizer gpt2 = make(false), llama = make(true), qwen2 = make(true, true);
  if (size == 0) return 0;
  const int choice = data[0] % 3;
  fsdp::data::Tokenizer& t = choice == 0 ? gpt2 : choice == 1 ? llama : qwen2;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  const std::vector<uint32_t> ids = t.encode(text);
  for (uint32_t id : ids) {
    if (id >= t.vocab_size()) __builtin_trap();
  }
  std::string fixed, normalized;
  std::string_view expected = fsdp::data::replace_invalid_utf8(text, fixed) ? fixed : text;
  if (choice == 2 && fsdp::data::detail::to_nfc(expected, normalized)) expected = normalized;
  if (t.decode(ids) != expected) __builtin_trap();
  return 0;
}
