// Data specs -> flat token sequences (see corpus.h). Every file is validated completely before
// its tokens count: a shard through the shard parser, a JSON-lines file line by line (the line
// number in every error), and every id against the vocabulary size when one is known, so a
// corpus that loads holds only ids the model can embed.
#include <fsdp/data/corpus.h>
#include <fsdp/data/error.h>
#include <fsdp/data/token_shard.h>

#include <nlohmann/json.hpp>

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
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

void load_jsonl(const std::string& path, const std::string& text, const CorpusOptions& options,
                std::vector<uint32_t>& out) {
  const uint32_t sep = separator(options, path);
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    ++line_no;
    const std::string_view line(text.data() + pos, end - pos);
    pos = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    nlohmann::json doc;
    try {
      doc = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      detail::throw_data_error(path, ":", line_no, ": malformed JSON: ", e.what());
    }
    FSDP_DATA_CHECK(doc.is_object(), path, ":", line_no, ": a JSON-lines document must be an ",
                    "object, not ", doc.type_name());
    auto it = doc.find(options.text_field);
    FSDP_DATA_CHECK(it != doc.end() && it->is_string(), path, ":", line_no, ": no string field '",
                    options.text_field, "' (set the text field)");
    const size_t first = out.size();
    out.push_back(sep);
    options.tokenizer->encode(it->get_ref<const std::string&>(), out);
    check_ids(out, first, options, path + ":" + std::to_string(line_no));
  }
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
                        std::vector<uint32_t>& out) {
  if (ends_with(path, ".bin")) {
    read_shard(path, options.vocab_size, out);
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
  }
  FSDP_DATA_CHECK(options.tokenizer != nullptr, "data file '", path,
                  "' is text, which needs a tokenizer (only .bin token shards do not)");
  const std::string text = read_all(path);
  if (ends_with(path, ".jsonl")) {
    load_jsonl(path, text, options, out);
  } else {
    const size_t first = out.size();
    out.push_back(separator(options, path));
    options.tokenizer->encode(text, out);
    check_ids(out, first, options, path);
  }
  return text.size();
}

TokenCorpus TokenCorpus::load(const std::string& spec, const CorpusOptions& options) {
  CorpusOptions opts = options;
  if (!opts.vocab_size && opts.tokenizer != nullptr) opts.vocab_size = opts.tokenizer->vocab_size();
  TokenCorpus corpus;
  corpus.spec_ = spec;
  corpus.files_ = expand_data_spec(spec);
  for (const auto& path : corpus.files_) {
    const size_t before = corpus.tokens_.size();
    const uint64_t bytes = load_data_file(path, opts, corpus.tokens_);
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
