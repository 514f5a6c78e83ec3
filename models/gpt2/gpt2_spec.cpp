// GPT-2 behind the model interface (fsdp/models/model.h): every GPT2Config name, built as
// GPT2LMHead with its blocks as the FSDP units. This file only adapts; what the model is and
// how it initializes, lays out and counts its memory lives in gpt2.h, hf.h and gpt2_memory.h.
#include <fsdp/runtime/forward.h>
#include <models/gpt2/gpt2.h>
#include <models/gpt2/gpt2_memory.h>
#include <models/gpt2/gpt2_spec.h>

#include <models/gpt2/gpt2_parallelize.h>
#include <models/gpt2/hf.h>

namespace fsdp::models {
namespace {

class GPT2Built : public Model {
 public:
  explicit GPT2Built(GPT2LMHead model) : model_(std::move(model)) {}
  std::shared_ptr<torch::nn::Module> root() const override { return model_.ptr(); }
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> units() const override {
    std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> out;
    const auto& blocks = model_->transformer->blocks;
    for (size_t i = 0; i < blocks.size(); ++i)
      out.emplace_back("transformer.h." + std::to_string(i), blocks[i].ptr());
    return out;
  }
  std::shared_ptr<torch::nn::Module> head() const override {
    return model_->lm_head
               ? model_->lm_head.ptr()
               : std::static_pointer_cast<torch::nn::Module>(model_->untied_lm_head.ptr());
  }
  at::Tensor forward(const at::Tensor& idx) override { return fsdp::forward(model_, idx); }
  // Logits split over the vocabulary by a tensor-parallel head are never gathered.
  at::Tensor loss(const at::Tensor& logits, const at::Tensor& targets) const override {
    return models::loss(logits, targets, model_->head());
  }
  at::Tensor summed_loss(const at::Tensor& logits, const at::Tensor& targets) const override {
    return models::summed_loss(logits, targets, model_->head());
  }
  void set_activation_checkpoint(bool on) override {
    for (auto& block : model_->transformer->blocks) block->set_activation_checkpoint(on);
  }

 private:
  GPT2LMHead model_;
};

class GPT2Spec : public ModelSpec {
 public:
  GPT2Spec(std::string name, GPT2Config config) : name_(std::move(name)), config_(config) {}
  std::string name() const override { return name_; }
  std::string family() const override { return "gpt2"; }
  int64_t num_parameters() const override { return models::num_parameters(config_); }
  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t max_seq_len() const override { return config_.n_positions; }
  std::vector<std::pair<std::string, int64_t>> sizes() const override {
    std::vector<std::pair<std::string, int64_t>> out = {{"vocab_size", config_.vocab_size},
                                                        {"n_positions", config_.n_positions},
                                                        {"n_embd", config_.n_embd},
                                                        {"n_layer", config_.n_layer},
                                                        {"n_head", config_.n_head}};
    if (config_.n_inner > 0) out.emplace_back("n_inner", config_.n_inner);
    if (!config_.tie_word_embeddings) out.emplace_back("tie_word_embeddings", 0);
    return out;
  }
  std::shared_ptr<const ModelSpec> with_overrides(const SizeOverrides& o) const override {
    GPT2Config c = config_;
    if (o.vocab_size > 0) c.vocab_size = o.vocab_size;
    if (o.max_seq_len > 0) c.n_positions = o.max_seq_len;
    if (o.dim > 0) c.n_embd = o.dim;
    if (o.n_layers > 0) c.n_layer = o.n_layers;
    if (o.n_heads > 0) c.n_head = o.n_heads;
    c.validate();
    return std::make_shared<GPT2Spec>(name_, c);
  }
  std::unique_ptr<Model> build(const BuildOptions& options) const override {
    GPT2Options o(config_);
    o.seed(options.seed())
        .activation_checkpoint(options.activation_checkpoint())
        .on_block_built(options.on_unit_built());
    return std::make_unique<GPT2Built>(GPT2LMHead(o));
  }
  checkpoint::FullLayout hf_layout() const override { return gpt2_hf_layout(config_); }
  // (GPT-2's config.json names no dtype; transformers reads it from the file.)
  std::string hf_config_json(at::ScalarType) const override { return gpt2_hf_config_json(config_); }
  ModelMemorySpec memory_spec(int64_t micro_batch, int64_t seq_len, at::ScalarType compute_dtype,
                              bool activation_checkpoint, int tp,
                              bool sequence_parallel) const override {
    return gpt2_memory_spec(config_, micro_batch, seq_len, compute_dtype, activation_checkpoint, tp,
                            sequence_parallel);
  }
  TensorParallelPlan unit_tp_plan(int tp, bool sequence_parallel) const override {
    return gpt2_block_tp_plan(config_, tp, sequence_parallel);
  }
  TensorParallelPlan root_tp_plan(int tp, bool sequence_parallel) const override {
    return gpt2_root_tp_plan(config_, tp, sequence_parallel);
  }

 private:
  std::string name_;
  GPT2Config config_;
};

}  // namespace

std::shared_ptr<const ModelSpec> make_gpt2_spec(std::string name, const GPT2Config& config) {
  config.validate();
  return std::make_shared<GPT2Spec>(std::move(name), config);
}

std::vector<std::shared_ptr<const ModelSpec>> gpt2_model_specs() {
  std::vector<std::shared_ptr<const ModelSpec>> specs;
  for (const auto& name : GPT2Config::names())
    specs.push_back(std::make_shared<GPT2Spec>(name, GPT2Config::by_name(name)));
  return specs;
}

}  // namespace fsdp::models
