// Unicode normalization for tokenizer.json's "normalizer" (Qwen2 and others ship NFC), by
// utf8proc, so that text is normalized as `tokenizers` normalizes it before pre-tokenization.
#pragma once

#include <string>
#include <string_view>

namespace fsdp::data::detail {

// Writes the NFC form of valid UTF-8 text to out and returns true, or returns false, leaving out
// alone, when text is its own NFC form because every code point is below U+0300 (no byte is
// 0xCC or above): the characters that compose, decompose or reorder all lie at or above U+0300,
// so such text (ASCII, Latin-1) costs one scan.
bool to_nfc(std::string_view text, std::string& out);

}  // namespace fsdp::data::detail
