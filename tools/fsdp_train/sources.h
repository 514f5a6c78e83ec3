// Where fsdp-train's tokens come from: --data, --val-data and --tokenizer, turned into the flat
// token sequences (fsdp/train/token_dataset.h) that batches are drawn from.
//
//   no --tokenizer, --data FILE     the file's bytes are the tokens (ids 0..255)
//   no --tokenizer, --data *.bin    token files: llm.c shards (.bin, labeled ones too) and
//                                   input_ids/labels .jsonl (fsdp/data/labeled.h); every id
//                                   must be below the model's vocabulary
//   --tokenizer FILE, --data SPEC   what fsdp::data::TokenCorpus takes: text, .jsonl (text
//                                   under --text-field, prompt/completion, input_ids/labels)
//                                   and .bin files, comma-separated, globs; any fine-tuning
//                                   file makes the dataset labeled (data.h)
//   no --data                       the embedded corpus (tokenized when --tokenizer is given):
//                                   its first 90% trains, and its last 10%, held out (never
//                                   trained on), is evaluated unless --val-data names other
//                                   held-out data
// --val-data SPEC is read as --data is.
#pragma once

#include <fsdp/train/token_dataset.h>
#include <fsdp_train/trainer.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace fsdp::data {
class Tokenizer;
}  // namespace fsdp::data

namespace fsdp::train {

// --tokenizer's tokenizer.json, parsed on first use and then kept, so that the model's
// vocabulary (model_spec_of) and the tokenizing of the data (load_datasets) read it once.
class JobTokenizer {
 public:
  explicit JobTokenizer(const JobConfig& options);
  ~JobTokenizer();
  JobTokenizer(const JobTokenizer&) = delete;
  JobTokenizer& operator=(const JobTokenizer&) = delete;

  // The tokenizer; null without --tokenizer. Throws naming --tokenizer when it cannot be read.
  data::Tokenizer* get();

 private:
  std::string path_;
  std::unique_ptr<data::Tokenizer> tokenizer_;
};

struct Datasets {
  TokenDataset train;
  std::optional<TokenDataset> val;  // none: no held-out loss
};

// Loads both. model_vocab: every id must be below it (the model's vocabulary). Throws naming the
// file and what is wrong (missing, unreadable, an id out of range, too short for one window of
// seq_len + 1 tokens).
// tokenizer: options' (--tokenizer), parsed once for the model and the data.
Datasets load_datasets(const JobConfig& options, int64_t model_vocab, JobTokenizer& tokenizer);

// Whether the tokens are a text's bytes (no tokenizer, and --data not all token files).
bool feeds_bytes(const JobConfig& options);

// Entropy in nats of the distribution of token ids: the loss of the best context-free model.
double unigram_entropy_of(const TokenDataset& data);

}  // namespace fsdp::train
