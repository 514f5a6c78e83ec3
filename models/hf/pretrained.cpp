// Models from a Hugging Face directory: DIR/config.json parsed and checked (hf_config.h), built
// through the family's own spec (models/llama/, models/gpt2/), and wrapped so that the spec
// keeps DIR's name and writes DIR's config.json back on export. See fsdp/models/model.h.
#include <fsdp/models/model.h>
#include <models/gpt2/gpt2_spec.h>
#include <models/hf/hf_config.h>
#include <models/llama/llama_spec.h>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <limits.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace fsdp::models {
namespace {

// POSIX calls, not std::filesystem: libtorch.so exports a clashing copy of parts of it (see
// [Note: no std::filesystem near LibTorch] in tests/support/files.h).
bool stat_is(const std::string& path, mode_t type) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && (st.st_mode & S_IFMT) == type;
}

std::string config_path(const std::string& dir) {
  return dir + (dir.empty() || dir.back() == '/' ? "" : "/") + "config.json";
}

// A spec built from config.json: the family's spec for everything but its name and the
// config.json it writes, which is the directory's own file with every field kept.
class PretrainedSpec : public ModelSpec {
 public:
  PretrainedSpec(std::string name, std::shared_ptr<const ModelSpec> inner,
                 std::shared_ptr<const nlohmann::json> original, std::string class_name)
      : name_(std::move(name)),
        inner_(std::move(inner)),
        original_(std::move(original)),
        class_name_(std::move(class_name)) {}
  std::string name() const override { return name_; }
  std::string family() const override { return inner_->family(); }
  int64_t num_parameters() const override { return inner_->num_parameters(); }
  int64_t vocab_size() const override { return inner_->vocab_size(); }
  int64_t max_seq_len() const override { return inner_->max_seq_len(); }
  std::vector<std::pair<std::string, int64_t>> sizes() const override { return inner_->sizes(); }
  std::shared_ptr<const ModelSpec> with_overrides(const SizeOverrides& o) const override {
    return std::make_shared<PretrainedSpec>(name_, inner_->with_overrides(o), original_,
                                            class_name_);
  }
  std::unique_ptr<Model> build(const BuildOptions& options) const override {
    return inner_->build(options);
  }
  checkpoint::FullLayout hf_layout() const override { return inner_->hf_layout(); }
  std::string hf_config_json(at::ScalarType dtype) const override;
  ModelMemorySpec memory_spec(int64_t micro_batch, int64_t seq_len, at::ScalarType compute_dtype,
                              bool activation_checkpoint, int tp,
                              bool sequence_parallel) const override {
    return inner_->memory_spec(micro_batch, seq_len, compute_dtype, activation_checkpoint, tp,
                               sequence_parallel);
  }
  TensorParallelPlan unit_tp_plan(int tp, bool sequence_parallel) const override {
    return inner_->unit_tp_plan(tp, sequence_parallel);
  }
  TensorParallelPlan root_tp_plan(int tp, bool sequence_parallel) const override {
    return inner_->root_tp_plan(tp, sequence_parallel);
  }

 private:
  std::string name_;
  std::shared_ptr<const ModelSpec> inner_;
  std::shared_ptr<const nlohmann::json> original_;
  std::string class_name_;
};

std::string PretrainedSpec::hf_config_json(at::ScalarType dtype) const {
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
              "hf_config_json: no transformers name for dtype ", dtype);
  const char* dtype_name = dtype == at::kFloat      ? "float32"
                           : dtype == at::kBFloat16 ? "bfloat16"
                                                    : "float16";
  nlohmann::json out = *original_;
  out["architectures"] = {class_name_};
  out["torch_dtype"] = dtype_name;  // transformers 4.x's name; 5.x reads it too
  if (out.contains("dtype")) out["dtype"] = dtype_name;
  // The sizes are this spec's: with_overrides may have changed them, and a size the file left
  // to a default (num_key_value_heads) must not follow a changed one it defaults from.
  for (const auto& [key, value] : inner_->sizes()) {
    if (key == "tie_word_embeddings") {
      out[key] = value != 0;
    } else {
      out[key] = value;
    }
  }
  return out.dump(2) + "\n";
}

// The directory's name for the spec: the last component of its real path ("SmolLM2-135M").
std::string name_of(const std::string& dir) {
  char resolved[PATH_MAX];
  std::string path = ::realpath(dir.c_str(), resolved) != nullptr ? resolved : dir;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const std::string name = path.substr(path.find_last_of('/') + 1);
  return name.empty() ? "hf-model" : name;
}

std::string read_config(const std::string& file) {
  struct stat st {};
  TORCH_CHECK(::stat(file.c_str(), &st) == 0, "cannot read '", file, "'");
  TORCH_CHECK(static_cast<uint64_t>(st.st_size) <= kMaxHfConfigBytes, "'", file, "' is ",
              st.st_size, " bytes, more than the ", kMaxHfConfigBytes, " a config.json may have");
  std::ifstream in(file, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  TORCH_CHECK(in.good() || in.eof(), "cannot read '", file, "'");
  return text.str();
}

}  // namespace

bool is_pretrained_dir(const std::string& path) {
  return stat_is(path, S_IFDIR) && stat_is(config_path(path), S_IFREG);
}

std::shared_ptr<const ModelSpec> model_spec_from_pretrained(const std::string& dir) {
  const std::string file = config_path(dir);
  TORCH_CHECK(is_pretrained_dir(dir), "'", dir,
              "' is not a Hugging Face model directory: it has no config.json");
  const std::string text = read_config(file);
  HfConfig parsed;
  try {
    parsed = parse_hf_config(text);
  } catch (const HfConfigError& e) {
    // e's message starts with "config.json": name the whole path instead.
    const std::string message = e.what();
    TORCH_CHECK(false, file, message.substr(std::string("config.json").size()));
  }
  const std::string name = name_of(dir);
  auto inner =
      parsed.llama ? make_llama_spec(name, *parsed.llama) : make_gpt2_spec(name, *parsed.gpt2);
  // parse_hf_config accepted the text, so it parses again.
  auto original = std::make_shared<const nlohmann::json>(nlohmann::json::parse(text));
  return std::make_shared<PretrainedSpec>(name, std::move(inner), std::move(original),
                                          parsed.class_name);
}

std::shared_ptr<const ModelSpec> resolve_model_spec(const std::string& name_or_dir) {
  for (const auto& name : model_names()) {
    if (name == name_or_dir) return model_spec(name);
  }
  if (is_pretrained_dir(name_or_dir)) return model_spec_from_pretrained(name_or_dir);
  TORCH_CHECK(!stat_is(name_or_dir, S_IFDIR), "model directory '", name_or_dir,
              "' has no config.json (a Hugging Face model directory holds one)");
  TORCH_CHECK(false, "unknown model '", name_or_dir, "': neither a registered name (",
              model_names_joined(), ") nor a directory holding a Hugging Face config.json");
}

}  // namespace fsdp::models
