// The token sources of a run.
//
// Invariants: the files are read as fsdp::train::load_token_dataset reads them (the same files
// in the same order on every rank). The split of the embedded corpus is by bytes, before
// tokenizing.
#include <fsdp_train/sources.h>

#include <fsdp/data/error.h>
#include <fsdp/data/tokenizer.h>
#include <fsdp_train/corpus.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <sys/stat.h>

#include <cstring>
#include <memory>
#include <vector>

namespace fsdp::train {
namespace {

constexpr double kDefaultValFraction = 0.1;

// tokenizer_config.json beside tokenizer.json, if there is one (it names BOS and EOS).
std::string config_beside(const std::string& tokenizer_path) {
  const auto slash = tokenizer_path.rfind('/');
  const std::string config =
      (slash == std::string::npos ? "" : tokenizer_path.substr(0, slash + 1)) +
      "tokenizer_config.json";
  struct stat st {};
  return ::stat(config.c_str(), &st) == 0 && S_ISREG(st.st_mode) ? config : "";
}

// The tokenizer at path; its errors name --tokenizer.
std::unique_ptr<data::Tokenizer> load_tokenizer(const std::string& path) {
  try {
    return std::make_unique<data::Tokenizer>(data::Tokenizer::from_file(path, config_beside(path)));
  } catch (const data::DataError& e) {
    TORCH_CHECK(false, "--tokenizer ", path, ": ", e.what());
  }
}

TokenDataset from_ids(const std::vector<uint32_t>& ids, std::string source) {
  at::Tensor t = at::empty({static_cast<int64_t>(ids.size())}, at::kInt);
  if (!ids.empty()) std::memcpy(t.data_ptr<int32_t>(), ids.data(), ids.size() * 4);
  return TokenDataset(t, std::move(source));
}

// --data or --val-data SPEC (flag names it in messages).
TokenDataset load_spec(const JobConfig& o, const std::string& flag, const std::string& spec,
                       data::Tokenizer* tokenizer, int64_t model_vocab) {
  TokenSourceOptions options;
  options.tokenizer = tokenizer;
  options.text_field = o.data.text_field;
  options.vocab_size = model_vocab;
  options.name = flag;
  return load_token_dataset(spec, options);
}

// The embedded corpus's bytes [begin, end), tokenized when there is a tokenizer.
TokenDataset embedded_part(data::Tokenizer* tokenizer, size_t begin, size_t end,
                           const std::string& source) {
  const std::string text(default_corpus().substr(begin, end - begin));
  if (tokenizer == nullptr) return TokenDataset(text, source);
  std::vector<uint32_t> ids;
  if (const auto bos = tokenizer->bos_id())
    ids.push_back(*bos);
  else if (const auto eos = tokenizer->eos_id())
    ids.push_back(*eos);
  tokenizer->encode(text, ids);
  return from_ids(ids, source + ", tokenized");
}

}  // namespace

bool feeds_bytes(const JobConfig& o) {
  return o.data.tokenizer.empty() && (o.data.path.empty() || !names_token_files_only(o.data.path));
}

JobTokenizer::JobTokenizer(const JobConfig& o) : path_(o.data.tokenizer) {}
JobTokenizer::~JobTokenizer() = default;

data::Tokenizer* JobTokenizer::get() {
  if (!tokenizer_ && !path_.empty()) tokenizer_ = load_tokenizer(path_);
  return tokenizer_.get();
}

Datasets load_datasets(const JobConfig& o, int64_t model_vocab, JobTokenizer& job_tokenizer) {
  data::Tokenizer* const tokenizer = job_tokenizer.get();
  if (tokenizer != nullptr) {
    TORCH_CHECK(int64_t(tokenizer->vocab_size()) <= model_vocab, "--tokenizer ", o.data.tokenizer,
                " has ", tokenizer->vocab_size(), " ids, more than model '", o.model.name,
                "''s vocabulary of ", model_vocab);
  }
  std::optional<TokenDataset> val;
  if (!o.data.val_path.empty()) {
    val.emplace(load_spec(o, "--val-data", o.data.val_path, tokenizer, model_vocab));
  }
  std::optional<TokenDataset> train;
  if (!o.data.path.empty()) {
    train.emplace(load_spec(o, "--data", o.data.path, tokenizer, model_vocab));
  } else {
    // The first 90% trains and the last 10% is held out, so the default run shows a user
    // how well the model generalizes, not only how well it fits.
    const size_t size = default_corpus().size();
    const auto split = static_cast<size_t>(double(size) * (1 - kDefaultValFraction));
    train.emplace(embedded_part(tokenizer, 0, val ? size : split, "the embedded corpus"));
    if (!val) {
      val.emplace(
          embedded_part(tokenizer, split, size, "the embedded corpus (its last 10%, held out)"));
    }
  }
  train->check_seq_len(o.training.seq_len);
  if (val) val->check_seq_len(o.training.seq_len);
  return Datasets{std::move(*train), std::move(val)};
}

double unigram_entropy_of(const TokenDataset& data) {
  const at::Tensor& tokens = data.tokens();
  if (tokens.scalar_type() == at::kByte) {
    return unigram_entropy_nats(
        std::string_view(reinterpret_cast<const char*>(tokens.data_ptr<uint8_t>()),
                         static_cast<size_t>(data.size())));
  }
  if (data.size() == 0) return 0.0;
  const at::Tensor counts = at::bincount(tokens.to(at::kLong)).to(at::kDouble);
  const at::Tensor p = counts.masked_select(counts > 0) / static_cast<double>(data.size());
  return -(p * p.log()).sum().item<double>();
}

}  // namespace fsdp::train
