// Training corpora as one flat sequence of token ids, from a data spec.
//
// A spec is a comma-separated list of files or glob patterns ("data/*.bin,extra.jsonl"); each
// pattern must match at least one file and each file must be a regular file. Files are read in
// the order given, a glob's matches in sorted order. The kind of a file is its extension:
//   .bin    an llm.c token shard (token_shard.h), taken as it is
//   .jsonl  JSON lines: each non-blank line is an object whose string field text_field
//           (default "text") is one document, or a fine-tuning example: prompt/completion
//           or input_ids/labels (labeled.h), decided per file by its first record
//   other   a text file, one document
// Text, JSON-lines text and prompt/completion need a tokenizer; input_ids/labels do not. Each
// document is preceded by one separator token: BOS when the tokenizer config names one (Llama 3's
// <|begin_of_text|> starts every document), otherwise EOS (llm.c's convention for GPT-2:
// <|endoftext|> before each document). A tokenizer with neither is refused for text input.
//
// Fine-tuning examples are neither preceded nor followed by a separator: a prompt/completion
// example ends with its EOS, an input_ids/labels one is taken as it is.
//
// Labels: a corpus with any fine-tuning file or labeled shard is labeled: labels() holds one
// label per token, kIgnoreIndex where the token does not train and the token's own id for every
// token of a text, a text document or a plain shard (all of which train). A corpus without one
// holds no labels.
//
// Errors (DataError) name the file and the byte offset or line: truncated shard, wrong magic,
// id >= vocab_size, malformed JSON on line N, a missing text field, a corpus too short for one
// window (check_window), and the fine-tuning records' errors (labeled.h).
//
// The trainer's use: TokenCorpus::load(spec, options) once per rank, check_window(seq_len),
// then draw windows of seq_len + 1 tokens from tokens() as TokenDataset does with bytes.
#pragma once

#include <fsdp/data/tokenizer.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::data {

struct CorpusOptions {
  // (optional) tokenizer for text and JSON-lines files; defaults to none (shards only). Not
  // owned; used from the loading thread only.
  Tokenizer* tokenizer = nullptr;
  // (optional) field holding a JSON-lines document's text; defaults to "text".
  std::string text_field = "text";
  // (optional) every id must be below this; defaults to the tokenizer's vocab_size() when a
  // tokenizer is given, else no check.
  std::optional<uint64_t> vocab_size;
  // (optional) called after each file with its path, its size in bytes and the tokens it
  // added; defaults to nothing.
  std::function<void(const std::string& path, uint64_t bytes, uint64_t tokens)> on_file;
};

// The files a spec names, in order. Throws naming a pattern that matches nothing, a path that
// does not exist, or one that is not a regular file.
std::vector<std::string> expand_data_spec(const std::string& spec);

class TokenCorpus {
 public:
  // Loads every file of spec. Throws DataError as described above.
  static TokenCorpus load(const std::string& spec, const CorpusOptions& options);

  const std::vector<uint32_t>& tokens() const { return tokens_; }
  // Whether any file carries labels; then labels() is as long as tokens(), else empty.
  bool labeled() const { return !labels_.empty(); }
  const std::vector<int32_t>& labels() const { return labels_; }
  const std::vector<std::string>& files() const { return files_; }
  const std::string& spec() const { return spec_; }

  // Throws naming the spec, its token count and the needed count unless the corpus holds at
  // least one window of seq_len + 1 tokens.
  void check_window(int64_t seq_len) const;

 private:
  std::vector<uint32_t> tokens_;
  std::vector<int32_t> labels_;
  std::vector<std::string> files_;
  std::string spec_;
};

// Appends the tokens of one file (a shard, JSON lines or text, by extension) to out, as
// TokenCorpus::load does for each file. Returns the file's size in bytes.
// (optional) labels: the labels of out as TokenCorpus::labels() holds them: empty as long as no
// file carried labels, else as long as out (the first labeled file fills in the labels of the
// tokens before it). Without it, a file that carries labels is refused.
uint64_t load_data_file(const std::string& path, const CorpusOptions& options,
                        std::vector<uint32_t>& out, std::vector<int32_t>* labels = nullptr);

}  // namespace fsdp::data
