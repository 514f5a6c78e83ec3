// fsdp-tokenize: tokenizes text and JSON-lines files with a Hugging Face tokenizer.json and
// writes one llm.c token shard.
//
//   fsdp-tokenize --tokenizer tokenizer.json --output train.bin 'data/*.jsonl' notes.txt
//
// Fine-tuning files (prompt/completion or input_ids/labels JSON lines, fsdp/data/labeled.h)
// make the shard a labeled one (token_shard.h), which keeps which tokens train, so a large set
// is tokenized once and fsdp-train reads it without a tokenizer.
//
// Every flag is checked before any work (missing file, directory instead of file, output
// directory absent), and each message names its flag. Progress goes to stderr, one line per
// input file with its MB/s, then a summary; stdout stays empty. Exit status 0 on success, 1 on
// a data error, 2 on a usage error.
#include "fsdp_tokenize/cli.h"

#include <fsdp/data/corpus.h>
#include <fsdp/data/error.h>
#include <fsdp/data/labeled.h>
#include <fsdp/data/token_shard.h>
#include <fsdp/data/tokenizer.h>

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

namespace fsdp::tools {
namespace {

using data::DataError;

// Throws DataError naming flag unless path is an existing regular file.
void check_input_file(const std::string& flag, const std::string& path) {
  struct stat st {};
  FSDP_DATA_CHECK(::stat(path.c_str(), &st) == 0, flag, " '", path, "': ", std::strerror(errno));
  FSDP_DATA_CHECK(S_ISREG(st.st_mode), flag, " '", path, "' is ",
                  S_ISDIR(st.st_mode) ? "a directory" : "not a regular file", ", not a file");
}

void check_output(const std::string& path) {
  FSDP_DATA_CHECK(path.size() > 4 && path.compare(path.size() - 4, 4, ".bin") == 0, "--output '",
                  path, "' must end in .bin (an llm.c token shard)");
  struct stat st {};
  FSDP_DATA_CHECK(::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode), "--output '", path,
                  "' exists and is not a regular file");
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  FSDP_DATA_CHECK(::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode), "--output '", path,
                  "': directory '", dir, "' does not exist");
}

// Checks every flag before any work; fills in the default --tokenizer-config. Returns the
// input files, the specs expanded.
std::vector<std::string> validate_flags(const std::string& tokenizer_path, std::string& config_path,
                                        const std::string& output, const std::string& text_field,
                                        const std::string& format,
                                        const std::vector<std::string>& inputs) {
  check_input_file("--tokenizer", tokenizer_path);
  if (config_path.empty()) {
    const size_t slash = tokenizer_path.rfind('/');
    const std::string beside =
        (slash == std::string::npos ? std::string() : tokenizer_path.substr(0, slash + 1)) +
        "tokenizer_config.json";
    struct stat st {};
    if (::stat(beside.c_str(), &st) == 0 && S_ISREG(st.st_mode)) config_path = beside;
  } else {
    check_input_file("--tokenizer-config", config_path);
  }
  check_output(output);
  FSDP_DATA_CHECK(!text_field.empty(), "--text-field must not be empty");
  FSDP_DATA_CHECK(format == "auto" || format == "uint16" || format == "uint32", "--format '",
                  format, "' is not auto, uint16 or uint32");
  std::vector<std::string> files;
  for (const auto& spec : inputs) {
    try {
      for (auto& f : data::expand_data_spec(spec)) files.push_back(std::move(f));
    } catch (const DataError& e) {
      throw DataError(std::string("input: ") + e.what());
    }
  }
  return files;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

class TokenizeCli : public ProgramCli {
 public:
  const char* name() const override { return "fsdp-tokenize"; }
  const char* description() const override {
    return "fsdp-tokenize: tokenize text / JSON-lines files into an llm.c token shard (a labeled "
           "one for prompt/completion or input_ids/labels fine-tuning data)";
  }
  // A data error reads "fsdp-tokenize: <what>": the message names the flag or the file.
  std::string error_line(const std::exception& e) const override {
    return std::string(name()) + ": " + e.what();
  }

  void add_flags(CLI::App& app) override {
    app.add_option("--tokenizer", tokenizer_path_, "Hugging Face tokenizer.json (byte-level BPE)")
        ->required();
    app.add_option("--tokenizer-config", config_path_,
                   "tokenizer_config.json naming BOS/EOS (default: the one next to --tokenizer, "
                   "if any)");
    app.add_option("--output", output_,
                   "Token shard to write (.bin); labeled (version 2 / 8, int32 labels after the "
                   "tokens) when an input is fine-tuning data")
        ->required();
    app.add_option("--text-field", text_field_, "Field of a JSON-lines document holding its text")
        ->capture_default_str();
    app.add_option("--format", format_,
                   "Shard format: auto (uint16 when the vocabulary fits, else uint32), uint16 "
                   "(llm.c gpt-2, magic 20240520) or uint32 (llm.c llama-3, magic 20240801)")
        ->capture_default_str();
    app.add_flag("--quiet", quiet_, "No progress lines");
    app.add_option("inputs", inputs_,
                   "Input files or globs (.jsonl: JSON lines of text, prompt/completion or "
                   "input_ids/labels; .bin: token shards; else text)")
        ->required();
  }

  // Every flag, then the tokenizer itself: a file that is no tokenizer.json is a bad --tokenizer.
  void check(const CLI::App&) override {
    files_ = validate_flags(tokenizer_path_, config_path_, output_, text_field_, format_, inputs_);
    try {
      tokenizer_.emplace(data::Tokenizer::from_file(tokenizer_path_, config_path_));
    } catch (const DataError& e) {
      throw DataError(std::string("--tokenizer: ") + e.what());
    }
  }

  int run(const CLI::App&, const std::vector<std::string>&) override {
    data::ShardFormat shard_format = format_ == "uint16" ? data::ShardFormat::kUint16
                                     : format_ == "uint32"
                                         ? data::ShardFormat::kUint32
                                         : data::shard_format_for(tokenizer_->vocab_size());
    FSDP_DATA_CHECK(shard_format == data::ShardFormat::kUint32 || tokenizer_->vocab_size() <= 65536,
                    "--format uint16 cannot hold the vocabulary of ", tokenizer_->vocab_size(),
                    " tokens of --tokenizer '", tokenizer_path_, "'");

    data::CorpusOptions options;
    options.tokenizer = &*tokenizer_;
    options.text_field = text_field_;
    options.vocab_size = tokenizer_->vocab_size();
    const auto start = std::chrono::steady_clock::now();
    uint64_t total_bytes = 0;
    std::vector<uint32_t> tokens;
    std::vector<int32_t> labels;  // empty unless an input carries labels
    for (size_t i = 0; i < files_.size(); ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      const size_t before = tokens.size();
      const uint64_t bytes = data::load_data_file(files_[i], options, tokens, &labels);
      total_bytes += bytes;
      if (!quiet_) {
        const double s = seconds_since(t0);
        std::fprintf(stderr, "[%zu/%zu] %s: %.2f MB, %zu tokens, %.1f MB/s\n", i + 1, files_.size(),
                     files_[i].c_str(), bytes / 1e6, tokens.size() - before,
                     s > 0 ? bytes / 1e6 / s : 0.0);
      }
    }
    data::write_shard(output_, tokens, shard_format, labels.empty() ? nullptr : &labels);
    if (!quiet_) {
      const double s = seconds_since(start);
      const size_t trained =
          labels.size() - std::count(labels.begin(), labels.end(), data::kIgnoreIndex);
      const std::string labeled =
          labels.empty() ? "" : ", labeled: " + std::to_string(trained) + " of them train";
      std::fprintf(stderr, "wrote %s: %zu tokens (%s%s) from %.2f MB in %.2f s, %.1f MB/s\n",
                   output_.c_str(), tokens.size(),
                   shard_format == data::ShardFormat::kUint16 ? "uint16" : "uint32",
                   labeled.c_str(), total_bytes / 1e6, s, s > 0 ? total_bytes / 1e6 / s : 0.0);
    }
    return 0;
  }

 private:
  std::string tokenizer_path_, config_path_, output_, text_field_ = "text", format_ = "auto";
  std::vector<std::string> inputs_;
  bool quiet_ = false;
  std::vector<std::string> files_;
  std::optional<data::Tokenizer> tokenizer_;
};

}  // namespace

std::unique_ptr<ProgramCli> make_tokenize_cli() { return std::make_unique<TokenizeCli>(); }

}  // namespace fsdp::tools
