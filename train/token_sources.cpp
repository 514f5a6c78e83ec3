// load_token_dataset (fsdp/train/token_dataset.h): a spec's files turned into the flat token
// sequence that batches are drawn from.
//
// Invariants: every rank loads the same files in the same order (expand_data_spec sorts a
// glob's matches), so every rank holds the same flat token array and draws the same batches.
// Without a tokenizer, a spec of anything but token files must be one text file, taken byte by
// byte: several text files would need separators that only a tokenizer defines.
#include <fsdp/data/corpus.h>
#include <fsdp/data/labeled.h>
#include <fsdp/train/token_dataset.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cstring>
#include <vector>

namespace fsdp::train {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// int32 holds every id and label: vocabularies stay below 2^31.
at::Tensor int32_tensor(const void* values, size_t n) {
  at::Tensor t = at::empty({static_cast<int64_t>(n)}, at::kInt);
  if (n > 0) std::memcpy(t.data_ptr<int32_t>(), values, n * 4);
  return t;
}

TokenDataset from_corpus(const data::TokenCorpus& corpus, std::string source) {
  const at::Tensor tokens = int32_tensor(corpus.tokens().data(), corpus.tokens().size());
  if (!corpus.labeled()) return TokenDataset(tokens, std::move(source));
  return TokenDataset(tokens, int32_tensor(corpus.labels().data(), corpus.labels().size()),
                      std::move(source));
}

}  // namespace

bool names_token_files_only(const std::string& spec) {
  for (const auto& file : data::expand_data_spec(spec)) {
    const bool ids =
        ends_with(file, ".bin") ||
        (ends_with(file, ".jsonl") && data::jsonl_form_of(file) == data::JsonlForm::kTokenIds);
    if (!ids) return false;
  }
  return true;
}

TokenDataset load_token_dataset(const std::string& spec, const TokenSourceOptions& options) {
  if (options.tokenizer == nullptr && !names_token_files_only(spec)) {
    const auto files = data::expand_data_spec(spec);
    TORCH_CHECK(files.size() == 1 && files[0] == spec, options.name, " '", spec, "' names ",
                files.size(),
                " files; without --tokenizer it takes one text file (its bytes are the tokens) "
                "or token files only (llm.c .bin shards, input_ids/labels .jsonl)");
    return TokenDataset::from_file(spec);
  }
  data::CorpusOptions corpus_options;
  corpus_options.tokenizer = options.tokenizer;
  corpus_options.text_field = options.text_field;
  if (options.vocab_size > 0) corpus_options.vocab_size = static_cast<uint64_t>(options.vocab_size);
  return from_corpus(data::TokenCorpus::load(spec, corpus_options),
                     options.name + " '" + spec + "'");
}

}  // namespace fsdp::train
