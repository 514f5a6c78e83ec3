// A training data set as one flat sequence of token ids: a text taken byte by byte (ids
// 0..255), or a tokenized corpus (fsdp/data/corpus.h: documents already concatenated with their
// BOS/EOS separators), and a training sample is a window of seq_len + 1 consecutive tokens.
// load_token_dataset reads it from text, JSON lines or llm.c token shards; fsdp/train/
// data_loader.h walks it step by step.
//
// Every rank computes the same global batch from (seed, step) alone and keeps its own rows, so
// the W micro-batches of a step, concatenated in rank order, are exactly the batch a single
// process would train on, for any world size.
//
// Fine-tuning data (fsdp/data/labeled.h) also carries one label per token, kIgnoreIndex (-100)
// where the token does not train. A window packs examples as it packs documents, and its
// targets are the labels shifted left by one (targets[t] = labels[o + t + 1]), so the positions
// that predict a prompt's tokens leave the loss, among them the last of the example before,
// whose next token is the prompt's first.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>

namespace fsdp::data {
class Tokenizer;
}  // namespace fsdp::data

namespace fsdp::train {

class TokenDataset {
 public:
  // text: the training text, used byte by byte. source names it in error messages.
  explicit TokenDataset(const std::string& text, std::string source = "training text");

  // Reads the whole file at path (UTF-8 or any bytes). Throws naming the path and the system's
  // reason if it cannot be opened or read.
  static TokenDataset from_file(const std::string& path);

  // Token ids: a 1-D uint8 or int32 CPU tensor (taken as it is, not copied). source names them
  // in error messages.
  TokenDataset(at::Tensor tokens, std::string source);
  // Token ids with their labels: both 1-D int32 CPU tensors of the same length.
  TokenDataset(at::Tensor tokens, at::Tensor labels, std::string source);

  // Number of tokens (bytes for a text).
  int64_t size() const { return tokens_.size(0); }
  // All tokens as a 1-D CPU tensor: uint8 for a text (a byte each), int32 for a tokenized
  // corpus; batches are widened to int64.
  const at::Tensor& tokens() const { return tokens_; }
  const std::string& source() const { return source_; }
  // Whether the tokens carry labels (fine-tuning data): then targets hold kIgnoreIndex where
  // nothing trains, and the loss is the mean over the others.
  bool labeled() const { return labels_.defined(); }
  // The labels: [N] int32 when labeled(), else undefined.
  const at::Tensor& labels() const { return labels_; }

  // Throws naming the text's length and the needed length unless the text holds at least one
  // window of seq_len + 1 bytes.
  void check_seq_len(int64_t seq_len) const;

  // The global batch of training step `step`: (inputs, targets), each [global_batch, seq_len]
  // int64 on the CPU, targets = inputs shifted left by one token (labeled: the labels shifted
  // left by one). Row b starts at an offset
  // drawn uniformly from [0, size() - seq_len - 1] by a SplitMix64 stream seeded from
  // (seed, step) (never torch's global generator), in row order: the same arguments give the
  // same rows in the same order on every rank, thread and run. Thread-safe.
  std::pair<at::Tensor, at::Tensor> global_batch(int64_t step, int64_t global_batch,
                                                 int64_t seq_len, uint64_t seed) const;

 private:
  at::Tensor tokens_;  // [N] uint8 (one byte per token keeps large texts cheap) or int32
  at::Tensor labels_;  // [N] int32, or undefined: every token trains
  std::string source_;
};

// How many targets train: those that are not kIgnoreIndex.
int64_t trained_targets(const at::Tensor& targets);

// Rank `rank`'s rows of a global batch: rows [rank * B / world, (rank + 1) * B / world) of
// dim 0, as views. Throws unless 0 <= rank < world and world divides B (naming both).
at::Tensor micro_batch(const at::Tensor& global, int64_t rank, int64_t world);
std::pair<at::Tensor, at::Tensor> micro_batch(const std::pair<at::Tensor, at::Tensor>& global,
                                              int64_t rank, int64_t world);

// Where load_token_dataset takes its tokens from, and how it names them.
struct TokenSourceOptions {
  // Tokenizes text and text JSON lines. (optional) defaults to none: a single text file is then
  // taken byte by byte, and otherwise only token files are accepted (llm.c .bin shards, labeled
  // ones too, and input_ids/labels .jsonl).
  data::Tokenizer* tokenizer = nullptr;
  // The field of a text .jsonl document. (optional) defaults to "text".
  std::string text_field = "text";
  // Every id must be below it (the model's vocabulary). (optional) defaults to 0: the
  // tokenizer's vocabulary, or unchecked without one.
  int64_t vocab_size = 0;
  // What the spec is called in messages and in TokenDataset::source() (e.g. a flag's name).
  // (optional) defaults to "data".
  std::string name = "data";
};

// The tokens of spec: a path, or what fsdp::data::TokenCorpus takes (files comma-separated,
// globs, sorted so that every rank reads the same files in the same order). Any fine-tuning
// file (prompt/completion or labeled) makes the dataset labeled. A tokenized corpus is held as
// int32 (every vocabulary we load is below 2^31); a text taken as bytes stays uint8. Throws
// naming the file and what is wrong (missing, unreadable, an id out of range, several files of
// text without a tokenizer).
TokenDataset load_token_dataset(const std::string& spec, const TokenSourceOptions& options = {});

// Whether spec names token files only (llm.c .bin shards and input_ids/labels .jsonl), which
// need no tokenizer.
bool names_token_files_only(const std::string& spec);

}  // namespace fsdp::train
