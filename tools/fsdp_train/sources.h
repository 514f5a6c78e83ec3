// Where fsdp-train's tokens come from: --data, --val-data and --tokenizer, turned into the flat
// token sequences (data.h) that batches are drawn from.
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

#include <fsdp_train/data.h>
#include <fsdp_train/trainer.h>

#include <cstdint>
#include <optional>
#include <string>

namespace fsdp::train {

struct Datasets {
  TokenDataset train;
  std::optional<TokenDataset> val;  // none: no held-out loss
};

// Loads both. model_vocab: every id must be below it (the model's vocabulary). Throws naming the
// file and what is wrong (missing, unreadable, an id out of range, too short for one window of
// seq_len + 1 tokens).
Datasets load_datasets(const JobConfig& options, int64_t model_vocab);

// Whether the tokens are a text's bytes (no tokenizer, and --data not all token files).
bool feeds_bytes(const JobConfig& options);

// The vocabulary size of the tokenizer.json at path (its BOS/EOS config is not needed for it).
int64_t tokenizer_vocab_size(const std::string& path);

// Entropy in nats of the distribution of token ids: the loss of the best context-free model.
double unigram_entropy_of(const TokenDataset& data);

}  // namespace fsdp::train
