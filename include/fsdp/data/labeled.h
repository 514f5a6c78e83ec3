// Fine-tuning data: JSON lines whose records say which tokens train.
//
// A JSON-lines file takes one of three forms, decided by the keys of its first non-blank record
// and held by every record after it:
//   text               a string field (CorpusOptions::text_field): one document, every token
//                      trains (corpus.h)
//   prompt/completion  "prompt" and "completion" strings: the prompt's tokens, the completion's,
//                      then EOS; only the completion's tokens and the EOS train
//   input_ids/labels   integer arrays of equal length, as Hugging Face pipelines write them after
//                      a chat template; labels[i] is kIgnoreIndex (-100) where token i does not
//                      train, and both are taken as they are (no tokenizer is involved)
// A record of another form than its file's, a missing or mistyped field, arrays of different
// lengths, an example in which nothing trains, an id or label outside the vocabulary: each is
// refused naming the file, the line and the key or the value.
//
// Labels follow Hugging Face's convention: labels[i] belongs to token i, and the position before
// it is trained to predict it (targets[t] = labels[t + 1] once examples are packed into one
// stream), so a masked label removes one prediction from the loss.
#pragma once

#include <cstdint>
#include <string>

namespace fsdp::data {

// The label of a token that does not train (PyTorch's cross_entropy ignore_index default).
constexpr int32_t kIgnoreIndex = -100;

enum class JsonlForm { kText, kPromptCompletion, kTokenIds };

// "text", "prompt/completion" or "input_ids/labels", for messages.
const char* jsonl_form_name(JsonlForm form);

// The form of the JSON-lines file at path, from the keys of its first non-blank record (text
// when it has neither prompt/completion nor input_ids/labels keys, or the file has no record).
// Throws DataError naming the file and line when that record is not a JSON object or mixes the
// keys of two forms.
JsonlForm jsonl_form_of(const std::string& path);

}  // namespace fsdp::data
