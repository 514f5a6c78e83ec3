// Fine-tuning records (labeled.h, records.h). A record is validated completely before any of it
// is appended, so a file either loads whole or throws, and the error names the first thing
// wrong: the key, then the index and value inside an array.
#include "data/records.h"

#include <fsdp/data/error.h>
#include <fsdp/data/labeled.h>

#include <cerrno>
#include <cstring>
#include <fstream>

namespace fsdp::data {
namespace {

constexpr const char* kPrompt = "prompt";
constexpr const char* kCompletion = "completion";
constexpr const char* kInputIds = "input_ids";
constexpr const char* kLabels = "labels";

bool has(const nlohmann::json& record, const char* key) { return record.contains(key); }

const std::string& string_field(const nlohmann::json& record, const char* key,
                                const std::string& where) {
  const auto it = record.find(key);
  FSDP_DATA_CHECK(it != record.end(), where, ": no field '", key,
                  "' (a prompt/completion file needs both \"prompt\" and \"completion\")");
  FSDP_DATA_CHECK(it->is_string(), where, ": '", key, "' must be a string, not ", it->type_name(),
                  " ", it->dump());
  return it->get_ref<const std::string&>();
}

const nlohmann::json& array_field(const nlohmann::json& record, const char* key,
                                  const std::string& where) {
  const auto it = record.find(key);
  FSDP_DATA_CHECK(it != record.end(), where, ": no field '", key,
                  "' (an input_ids/labels file needs both \"input_ids\" and \"labels\")");
  FSDP_DATA_CHECK(it->is_array(), where, ": '", key, "' must be an array of integers, not ",
                  it->type_name());
  return *it;
}

void check_id(uint32_t id, std::optional<uint64_t> vocab_size, const std::string& where) {
  FSDP_DATA_CHECK(!vocab_size || id < *vocab_size, where, ": token id ", id,
                  " is not below the vocabulary size ", *vocab_size);
}

// Element i of an integer array: input_ids are ids, labels are ids or kIgnoreIndex.
int64_t integer_at(const nlohmann::json& array, const char* key, size_t i,
                   const std::string& where) {
  const nlohmann::json& v = array[i];
  FSDP_DATA_CHECK(v.is_number_integer(), where, ": ", key, "[", i, "] is ", v.dump(),
                  ", not an integer");
  return v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX
                                                                           : v.get<int64_t>();
}

uint32_t id_at(const nlohmann::json& array, const char* key, size_t i,
               std::optional<uint64_t> vocab_size, const std::string& where) {
  const int64_t v = integer_at(array, key, i, where);
  const uint64_t limit = vocab_size ? *vocab_size : uint64_t{1} << 31;
  FSDP_DATA_CHECK(v >= 0 && uint64_t(v) < limit, where, ": ", key, "[", i, "] is ", v,
                  ", outside the vocabulary [0, ", limit, ")");
  return static_cast<uint32_t>(v);
}

}  // namespace

const char* jsonl_form_name(JsonlForm form) {
  switch (form) {
    case JsonlForm::kPromptCompletion:
      return "prompt/completion";
    case JsonlForm::kTokenIds:
      return "input_ids/labels";
    case JsonlForm::kText:
      break;
  }
  return "text";
}

JsonlForm form_of_record(const nlohmann::json& record, const std::string& where) {
  const bool pc = has(record, kPrompt) || has(record, kCompletion);
  const bool ids = has(record, kInputIds) || has(record, kLabels);
  FSDP_DATA_CHECK(!(pc && ids), where, ": a record has either prompt/completion or ",
                  "input_ids/labels, not both: ", record.dump().substr(0, 200));
  return pc ? JsonlForm::kPromptCompletion : ids ? JsonlForm::kTokenIds : JsonlForm::kText;
}

nlohmann::json parse_jsonl_record(std::string_view line, const std::string& where) {
  if (line.find_first_not_of(" \t\r") == std::string_view::npos) return nullptr;
  nlohmann::json record;
  try {
    record = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    detail::throw_data_error(where, ": malformed JSON: ", e.what());
  }
  FSDP_DATA_CHECK(record.is_object(), where, ": a JSON-lines record must be an object, not ",
                  record.type_name());
  return record;
}

JsonlForm jsonl_form_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  FSDP_DATA_CHECK(in.good(), "cannot open '", path, "': ", std::strerror(errno));
  size_t line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    const std::string where = path + ":" + std::to_string(line_no);
    const nlohmann::json record = parse_jsonl_record(line, where);
    if (!record.is_null()) return form_of_record(record, where);
  }
  return JsonlForm::kText;
}

void append_prompt_completion(const nlohmann::json& record, Tokenizer& tokenizer, uint32_t eos,
                              std::optional<uint64_t> vocab_size, const std::string& where,
                              LabeledTokens out) {
  const std::string& prompt = string_field(record, kPrompt, where);
  const std::string& completion = string_field(record, kCompletion, where);
  const size_t first = out.tokens.size();
  tokenizer.encode(prompt, out.tokens);
  const size_t answer = out.tokens.size();
  tokenizer.encode(completion, out.tokens);
  out.tokens.push_back(eos);
  for (size_t i = first; i < out.tokens.size(); ++i) {
    check_id(out.tokens[i], vocab_size, where);
    out.labels.push_back(i < answer ? kIgnoreIndex : static_cast<int32_t>(out.tokens[i]));
  }
}

void append_token_ids(const nlohmann::json& record, std::optional<uint64_t> vocab_size,
                      const std::string& where, LabeledTokens out) {
  const nlohmann::json& ids = array_field(record, kInputIds, where);
  const nlohmann::json& labels = array_field(record, kLabels, where);
  FSDP_DATA_CHECK(ids.size() == labels.size(), where, ": input_ids has ", ids.size(),
                  " elements but labels has ", labels.size(), "; they must be equally long");
  FSDP_DATA_CHECK(!ids.empty(), where, ": input_ids and labels are empty");
  std::vector<uint32_t> record_ids(ids.size());
  std::vector<int32_t> record_labels(ids.size());
  bool trains = false;
  for (size_t i = 0; i < ids.size(); ++i) {
    record_ids[i] = id_at(ids, kInputIds, i, vocab_size, where);
    const int64_t label = integer_at(labels, kLabels, i, where);
    if (label == kIgnoreIndex) {
      record_labels[i] = kIgnoreIndex;
      continue;
    }
    const uint64_t limit = vocab_size ? *vocab_size : uint64_t{1} << 31;
    FSDP_DATA_CHECK(label >= 0 && uint64_t(label) < limit, where, ": labels[", i, "] is ", label,
                    ", neither ", kIgnoreIndex, " (masked) nor an id in [0, ", limit, ")");
    record_labels[i] = static_cast<int32_t>(label);
    trains = true;
  }
  FSDP_DATA_CHECK(trains, where, ": every label is ", kIgnoreIndex,
                  ", so nothing in this example trains");
  out.tokens.insert(out.tokens.end(), record_ids.begin(), record_ids.end());
  out.labels.insert(out.labels.end(), record_labels.begin(), record_labels.end());
}

}  // namespace fsdp::data
