// Llama behind the model interface (fsdp/models/model.h): every LlamaConfig name, built as
// LlamaForCausalLM with its decoder layers as the FSDP units.
#include <fsdp/runtime/forward.h>
#include <models/llama/hf.h>
#include <models/llama/llama.h>
#include <models/llama/llama_memory.h>
#include <models/llama/llama_spec.h>

#include <models/llama/llama_parallelize.h>

namespace fsdp::models {
namespace {

class LlamaBuilt : public Model {
 public:
  explicit LlamaBuilt(LlamaForCausalLM model) : model_(std::move(model)) {}
  std::shared_ptr<torch::nn::Module> root() const override { return model_.ptr(); }
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> units() const override {
    std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> out;
    const auto& layers = model_->model->decoder_layers;
    for (size_t i = 0; i < layers.size(); ++i)
      out.emplace_back("model.layers." + std::to_string(i), layers[i].ptr());
    return out;
  }
  std::shared_ptr<torch::nn::Module> head() const override { return model_->lm_head; }
  at::Tensor forward(const at::Tensor& idx) override { return fsdp::forward(model_, idx); }
  // Logits split over the vocabulary by a tensor-parallel head are never gathered.
  at::Tensor loss(const at::Tensor& logits, const at::Tensor& targets) const override {
    return models::loss(logits, targets, *model_->lm_head);
  }
  at::Tensor summed_loss(const at::Tensor& logits, const at::Tensor& targets) const override {
    return models::summed_loss(logits, targets, *model_->lm_head);
  }
  void set_activation_checkpoint(bool on) override {
    for (auto& layer : model_->model->decoder_layers) layer->set_activation_checkpoint(on);
  }

 private:
  LlamaForCausalLM model_;
};

class LlamaSpec : public ModelSpec {
 public:
  LlamaSpec(std::string name, LlamaConfig config) : name_(std::move(name)), config_(config) {}
  std::string name() const override { return name_; }
  std::string family() const override { return "llama"; }
  int64_t num_parameters() const override { return models::num_parameters(config_); }
  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t max_seq_len() const override { return config_.max_seq_len(); }
  std::vector<std::pair<std::string, int64_t>> sizes() const override {
    std::vector<std::pair<std::string, int64_t>> out = {
        {"vocab_size", config_.vocab_size},
        {"hidden_size", config_.hidden_size},
        {"intermediate_size", config_.intermediate_size},
        {"num_hidden_layers", config_.num_hidden_layers},
        {"num_attention_heads", config_.num_attention_heads},
        {"num_key_value_heads", config_.num_key_value_heads},
        {"max_position_embeddings", config_.max_position_embeddings},
        {"tie_word_embeddings", config_.tie_word_embeddings ? 1 : 0}};
    if (config_.explicit_head_dim > 0) out.emplace_back("head_dim", config_.explicit_head_dim);
    if (config_.sliding_window > 0) out.emplace_back("sliding_window", config_.sliding_window);
    return out;
  }
  std::shared_ptr<const ModelSpec> with_overrides(const SizeOverrides& o) const override {
    LlamaConfig c = config_;
    if (o.vocab_size > 0) c.vocab_size = o.vocab_size;
    if (o.max_seq_len > 0) c.max_position_embeddings = o.max_seq_len;
    if (o.dim > 0) c.hidden_size = o.dim;
    if (o.n_layers > 0) c.num_hidden_layers = o.n_layers;
    if (o.n_heads > 0) c.num_attention_heads = o.n_heads;
    c.validate();
    return std::make_shared<LlamaSpec>(name_, c);
  }
  std::unique_ptr<Model> build(const BuildOptions& options) const override {
    LlamaOptions o(config_);
    o.seed(options.seed())
        .activation_checkpoint(options.activation_checkpoint())
        .on_layer_built(options.on_unit_built());
    return std::make_unique<LlamaBuilt>(LlamaForCausalLM(o));
  }
  checkpoint::FullLayout hf_layout() const override { return llama_hf_layout(config_); }
  std::string hf_config_json(at::ScalarType dtype) const override {
    return llama_hf_config_json(config_, dtype);
  }
  ModelMemorySpec memory_spec(int64_t micro_batch, int64_t seq_len, at::ScalarType compute_dtype,
                              bool activation_checkpoint, int tp,
                              bool sequence_parallel) const override {
    return llama_memory_spec(config_, micro_batch, seq_len, compute_dtype, activation_checkpoint,
                             tp, sequence_parallel);
  }
  TensorParallelPlan unit_tp_plan(int tp, bool sequence_parallel) const override {
    return llama_layer_tp_plan(config_, tp, sequence_parallel);
  }
  TensorParallelPlan root_tp_plan(int tp, bool sequence_parallel) const override {
    return llama_root_tp_plan(config_, tp, sequence_parallel);
  }

 private:
  std::string name_;
  LlamaConfig config_;
};

}  // namespace

std::shared_ptr<const ModelSpec> make_llama_spec(std::string name, const LlamaConfig& config) {
  config.validate();
  return std::make_shared<LlamaSpec>(std::move(name), config);
}

std::vector<std::shared_ptr<const ModelSpec>> llama_model_specs() {
  std::vector<std::shared_ptr<const ModelSpec>> specs;
  for (const auto& name : LlamaConfig::names())
    specs.push_back(std::make_shared<LlamaSpec>(name, LlamaConfig::by_name(name)));
  return specs;
}

}  // namespace fsdp::models
