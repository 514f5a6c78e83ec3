// One record of a fine-tuning JSON-lines file (fsdp/data/labeled.h) turned into tokens and
// labels; corpus.cpp reads the lines and calls these per record.
#pragma once

#include <fsdp/data/labeled.h>
#include <fsdp/data/tokenizer.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp::data {

// One line of a JSON-lines file: its record, or null for a blank line. where ("file:line") heads
// the DataError thrown for malformed JSON or a record that is not an object.
nlohmann::json parse_jsonl_record(std::string_view line, const std::string& where);

// What a record's keys make of it. where ("file:line") names it in errors: a record with the
// keys of two forms is refused.
JsonlForm form_of_record(const nlohmann::json& record, const std::string& where);

// The tokens and labels of a file, appended record by record.
struct LabeledTokens {
  std::vector<uint32_t>& tokens;
  std::vector<int32_t>& labels;
};

// prompt + completion + eos, the prompt's labels kIgnoreIndex. Throws DataError naming where
// and the key when a field is missing or not a string, or an id is not below vocab_size.
void append_prompt_completion(const nlohmann::json& record, Tokenizer& tokenizer, uint32_t eos,
                              std::optional<uint64_t> vocab_size, const std::string& where,
                              LabeledTokens out);

// input_ids and labels as they are. Throws DataError naming where, the key and the value: a
// missing field or one that is not an array of integers, arrays of different lengths or none
// long, an id or label (other than kIgnoreIndex) not below vocab_size, every label masked.
void append_token_ids(const nlohmann::json& record, std::optional<uint64_t> vocab_size,
                      const std::string& where, LabeledTokens out);

}  // namespace fsdp::data
