// Data specs -> flat token sequences (see corpus.h). Every file is validated completely before
// its tokens count: a shard through the shard parser, a JSON-lines file line by line (the line
// number in every error), and every id against the vocabulary size when one is known, so a
// corpus that loads holds only ids the model can embed.
#include <fsdp/data/corpus.h>
#include <fsdp/data/error.h>
#include <fsdp/data/labeled.h>
#include <fsdp/data/token_shard.h>

#include "data/records.h"

#include <nlohmann/json.hpp>

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

namespace fsdp::data {
namespace {

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

void check_regular_file(const std::string& path, const std::string& spec) {
  struct stat st {};
  FSDP_DATA_CHECK(::stat(path.c_str(), &st) == 0, "data file '", path, "' (in spec '", spec,
                  "'): ", std::strerror(errno));
  FSDP_DATA_CHECK(S_ISREG(st.st_mode), "data file '", path, "' (in spec '", spec,
                  "') is not a regular file", S_ISDIR(st.st_mode) ? " but a directory" : "");
}

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  FSDP_DATA_CHECK(in.good(), "cannot open '", path, "': ", std::strerror(errno));
  std::ostringstream os;
  os << in.rdbuf();
  FSDP_DATA_CHECK(!in.bad(), "cannot read '", path, "'");
  return os.str();
}

uint32_t separator(const CorpusOptions& options, const std::string& path) {
  const Tokenizer& t = *options.tokenizer;
  if (t.bos_id()) return *t.bos_id();
  FSDP_DATA_CHECK(t.eos_id().has_value(), "text file '", path,
                  "' needs a document separator, but the tokenizer names neither a BOS nor an "
                  "EOS token (give its tokenizer_config.json)");
  return *t.eos_id();
}

void check_ids(const std::vector<uint32_t>& out, size_t first, const CorpusOptions& options,
               const std::string& where) {
  if (!options.vocab_size) return;
  for (size_t i = first; i < out.size(); ++i) {
    FSDP_DATA_CHECK(out[i] < *options.vocab_size, where, ": token id ", out[i],
                    " is not below the vocabulary size ", *options.vocab_size);
  }
}

void require_tokenizer(const CorpusOptions& options, const std::string& path, const char* what) {
  FSDP_DATA_CHECK(options.tokenizer != nullptr, "data file '", path, "' is ", what,
                  ", which needs a tokenizer (only .bin token shards and input_ids/labels JSON ",
                  "lines do not)");
}

// How the records of one JSON-lines file become tokens: its form, taken from its first record.
class JsonlReader {
 public:
  JsonlReader(const std::string& path, const CorpusOptions& options, LabeledTokens out)
      : path_(path), options_(options), out_(out) {}

  void add(const nlohmann::json& doc, size_t line_no) {
    const std::string where = path_ + ":" + std::to_string(line_no);
    const JsonlForm mine = form_of_record(doc, where);
    if (!form_) start(mine, line_no);
    // A record without the file's keys is named by the appender, which misses them.
    FSDP_DATA_CHECK(mine == *form_ || mine == JsonlForm::kText, where, ": a record of the ",
                    jsonl_form_name(mine), " form in a file of the ", jsonl_form_name(*form_),
                    " form (a file's form is its first record's, line ", first_line_, ")");
    switch (*form_) {
      case JsonlForm::kPromptCompletion:
        return append_prompt_completion(doc, *options_.tokenizer, separator_, options_.vocab_size,
                                        where, out_);
      case JsonlForm::kTokenIds:
        return append_token_ids(doc, options_.vocab_size, where, out_);
      case JsonlForm::kText:
        return add_text(doc, where);
    }
  }

 private:
  void start(JsonlForm form, size_t line_no) {
    form_ = form;
    first_line_ = line_no;
    if (form == JsonlForm::kTokenIds) return;
    require_tokenizer(
        options_, path_,
        form == JsonlForm::kText ? "JSON lines of text" : "prompt/completion JSON lines");
    if (form == JsonlForm::kText) {
      separator_ = separator(options_, path_);
      return;
    }
    const auto eos = options_.tokenizer->eos_id();
    FSDP_DATA_CHECK(eos.has_value(), "prompt/completion file '", path_, "' ends each example ",
                    "with EOS, but the tokenizer names none (give its tokenizer_config.json)");
    separator_ = *eos;
  }

  void add_text(const nlohmann::json& doc, const std::string& where) {
    auto it = doc.find(options_.text_field);
    FSDP_DATA_CHECK(it != doc.end() && it->is_string(), where, ": no string field '",
                    options_.text_field, "' (set the text field)");
    const size_t first = out_.tokens.size();
    out_.tokens.push_back(separator_);
    options_.tokenizer->encode(it->get_ref<const std::string&>(), out_.tokens);
    check_ids(out_.tokens, first, options_, where);
  }

  const std::string& path_;
  const CorpusOptions& options_;
  LabeledTokens out_;
  std::optional<JsonlForm> form_;
  size_t first_line_ = 0;
  uint32_t separator_ = 0;  // text: before each document; prompt/completion: EOS after each
};

// Fine-tuning records append their labels to labels; text documents append none.
void load_jsonl(const std::string& path, const std::string& text, const CorpusOptions& options,
                std::vector<uint32_t>& out, std::vector<int32_t>& labels) {
  JsonlReader reader(path, options, LabeledTokens{out, labels});
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    ++line_no;
    const std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    const nlohmann::json doc = parse_jsonl_record(line, path + ":" + std::to_string(line_no));
    if (!doc.is_null()) reader.add(doc, line_no);
  }
}

// The tokens of one file appended to out, and when it carries labels, its labels to labels.
uint64_t load_file_tokens(const std::string& path, const CorpusOptions& options,
                          std::vector<uint32_t>& out, std::vector<int32_t>& labels) {
  if (ends_with(path, ".bin")) {
    read_shard(path, options.vocab_size, out, &labels);
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  }
  const std::string text = read_all(path);
  if (ends_with(path, ".jsonl")) {
    load_jsonl(path, text, options, out, labels);
  } else {
    require_tokenizer(options, path, "text");
    const size_t first = out.size();
    out.push_back(separator(options, path));
    options.tokenizer->encode(text, out);
    check_ids(out, first, options, path);
  }
  return text.size();
}

// labels up to end: the tokens from labels->size() on train as themselves.
void label_as_tokens(const std::vector<uint32_t>& out, size_t end, std::vector<int32_t>& labels) {
  labels.reserve(out.size());
  for (size_t i = labels.size(); i < end; ++i) labels.push_back(static_cast<int32_t>(out[i]));
}

}  // namespace

std::vector<std::string> expand_data_spec(const std::string& spec) {
  std::vector<std::string> files;
  FSDP_DATA_CHECK(!spec.empty(), "empty data spec");
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = spec.find(',', pos);
    if (comma == std::string::npos) comma = spec.size();
    const std::string item = spec.substr(pos, comma - pos);
    pos = comma + 1;
    FSDP_DATA_CHECK(!item.empty(), "data spec '", spec, "' has an empty entry");
    if (item.find_first_of("*?[") != std::string::npos) {
      glob_t g{};
      const int rc = ::glob(item.c_str(), GLOB_ERR, nullptr, &g);
      std::vector<std::string> matches(g.gl_pathv, g.gl_pathv + g.gl_pathc);
      ::globfree(&g);
      FSDP_DATA_CHECK(rc == 0 && !matches.empty(), "data spec pattern '", item,
                      "' matches no file");
      std::sort(matches.begin(), matches.end());
      for (auto& m : matches) {
        check_regular_file(m, spec);
        files.push_back(std::move(m));
      }
    } else {
      check_regular_file(item, spec);
      files.push_back(item);
    }
  }
  return files;
}

uint64_t load_data_file(const std::string& path, const CorpusOptions& options,
                        std::vector<uint32_t>& out, std::vector<int32_t>* labels) {
  const size_t first = out.size();
  std::vector<int32_t> file_labels;
  const uint64_t bytes = load_file_tokens(path, options, out, file_labels);
  if (file_labels.empty() && (labels == nullptr || labels->empty())) return bytes;
  if (labels == nullptr) {
    out.resize(first);
    detail::throw_data_error("data file '", path, "' carries labels (fine-tuning data), which ",
                             "this reader does not take");
  }
  label_as_tokens(out, first, *labels);
  if (file_labels.empty()) {
    label_as_tokens(out, out.size(), *labels);
  } else {
    labels->insert(labels->end(), file_labels.begin(), file_labels.end());
  }
  return bytes;
}

TokenCorpus TokenCorpus::load(const std::string& spec, const CorpusOptions& options) {
  CorpusOptions opts = options;
  if (!opts.vocab_size && opts.tokenizer != nullptr) opts.vocab_size = opts.tokenizer->vocab_size();
  TokenCorpus corpus;
  corpus.spec_ = spec;
  corpus.files_ = expand_data_spec(spec);
  for (const auto& path : corpus.files_) {
    const size_t before = corpus.tokens_.size();
    const uint64_t bytes = load_data_file(path, opts, corpus.tokens_, &corpus.labels_);
    if (opts.on_file) opts.on_file(path, bytes, corpus.tokens_.size() - before);
  }
  return corpus;
}

void TokenCorpus::check_window(int64_t seq_len) const {
  FSDP_DATA_CHECK(seq_len > 0, "seq_len must be positive, not ", seq_len);
  FSDP_DATA_CHECK(static_cast<uint64_t>(tokens_.size()) >= static_cast<uint64_t>(seq_len) + 1,
                  "data '", spec_, "' has ", tokens_.size(), " tokens, fewer than one window of ",
                  "seq_len + 1 = ", seq_len + 1);
}

}  // namespace fsdp::data
