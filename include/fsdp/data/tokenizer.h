// Byte-level BPE tokenizers from Hugging Face tokenizer.json files (GPT-2, Llama 3 and the
// like), giving the same ids as Python's `tokenizers` package.
//
// Supported, and nothing else (anything else is refused with a DataError naming the
// component, never tokenized differently):
// - model: BPE with merges as "a b" strings or ["a", "b"] pairs, ignore_merges, unk_token
//   (with fuse_unk); dropout must be null or 0, continuing_subword_prefix and
//   end_of_word_suffix null or empty, byte_fallback false.
// - normalizer: null, NFC (Qwen2's), or a Sequence of NFCs; NFC by utf8proc, applied to the
//   text between tokens with normalized=false, as `tokenizers` does.
// - pre_tokenizer: ByteLevel (add_prefix_space, use_regex with GPT-2's pattern), Split with a
//   Regex or String pattern and behavior "Isolated" (invert false), or a Sequence of these.
// - decoder: ByteLevel or null (then decode() throws).
// - post_processor: ignored; encode() is `tokenizers`' encode(text, add_special_tokens=False).
// - added_tokens: split out of the text before pre-tokenization, leftmost-longest, first the
//   tokens with normalized=false, then those with normalized=true, as `tokenizers` does;
//   lstrip, rstrip and single_word must be false. `tokenizers` ignores the ids the file gives
//   added tokens and numbers them itself (the vocabulary's id when the content is there, else
//   on from the vocabulary's size); a file whose ids disagree with that is refused.
//
// Text is bytes. Invalid UTF-8 is replaced before tokenizing, each maximal ill-formed
// subsequence by U+FFFD (the Unicode "maximal subpart" rule that Python's
// bytes.decode("utf-8", errors="replace") follows), so encode(b) equals `tokenizers` on
// b.decode("utf-8", "replace"). Valid UTF-8 is tokenized without a copy.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp::data {

class Tokenizer {
 public:
  // Loads tokenizer.json at path; config_path (optional, "" for none) is a
  // tokenizer_config.json whose bos_token and eos_token (a string or {"content": ...}) name the
  // BOS and EOS tokens. Throws DataError naming the file and what is wrong or unsupported.
  static Tokenizer from_file(const std::string& path, const std::string& config_path = "");
  // The same from the files' contents; source names them in error messages.
  static Tokenizer from_json(std::string_view tokenizer_json, std::string_view config_json = "",
                             const std::string& source = "tokenizer.json");

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Appends the ids of text to out. Not thread-safe (it fills a cache of pre-token -> ids);
  // give each thread its own Tokenizer.
  void encode(std::string_view text, std::vector<uint32_t>& out);
  std::vector<uint32_t> encode(std::string_view text);

  // The bytes the ids stand for, as the ByteLevel decoder gives them (special tokens
  // included unless skip_special_tokens). The bytes may be invalid UTF-8 where a multi-byte
  // character is split across a cut; `tokenizers` would show U+FFFD there. Throws on an id
  // >= vocab_size() or when the tokenizer has no decoder.
  std::string decode(const std::vector<uint32_t>& ids, bool skip_special_tokens = false) const;

  // One more than the largest id (model vocabulary and added tokens).
  uint32_t vocab_size() const;
  // The id of a token's exact string (as tokenizer.json spells it), if any.
  std::optional<uint32_t> token_to_id(std::string_view token) const;
  // BOS and EOS from tokenizer_config.json, if it was given and names them.
  std::optional<uint32_t> bos_id() const;
  std::optional<uint32_t> eos_id() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Replaces invalid UTF-8 in text as encode() does. Returns false (and leaves out untouched)
// when text is valid already.
bool replace_invalid_utf8(std::string_view text, std::string& out);

}  // namespace fsdp::data
