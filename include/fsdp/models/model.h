// The model plug-in interface: what the trainer (fsdp-train), the estimator (fsdp-estimate),
// full-checkpoint export/import and the tests need from a model, so that none of them names
// one. A model family is a folder under models/ (gpt2/, llama/) that implements ModelSpec for
// each of its named configurations; registry.cpp lists the families, one line each.
//
// The contract a family implements (torchtitan's model / parallelize / state_dict_adapter /
// config_registry, in one interface):
// - build: constructs the model with every parameter's initial value a pure function of
//   (seed, parameter name) and hands each FSDP unit to on_unit_built as soon as it is built and
//   initialized, before the next unit exists (deferred initialization: a callback that shards
//   the unit keeps construction's peak at the root's parameters plus one full unit);
// - shard plan: the units handed out (also listed by Model::units(), in forward order) are the
//   FSDP units; the root (Model::root()) is sharded last and owns what is left (embeddings,
//   final norm, output projection);
// - parameter names are Hugging Face's for the family's transformers class, and hf_layout()
//   maps them to and from that class's safetensors files (transposes, tied weights, prefixes);
//   hf_config_json() is the config.json that class loads;
// - memory_spec() describes the model to the estimator (include/fsdp/memory_estimate.h)
//   without building it;
// - forward(idx) calls the root through fsdp::forward, and the model calls every module that
//   has parameters through fsdp::forward (or fsdp::forward_with), so that an auto-wrap policy
//   (fsdp/wrap_policy.h, fsdp-train --wrap-policy) may make any of them a unit.
// Model implementations (which call fsdp::checkpoint, the function) include
// models/common/modules.h, not this header: fsdp::checkpoint is also the namespace of the
// checkpoint types used here, and C++ allows one of the two per translation unit.
#pragma once

#include <fsdp/checkpoint/checkpoint.h>
#include <fsdp/memory_estimate.h>
#include <fsdp/models/unit_built.h>
#include <fsdp/tensor_parallel.h>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <torch/arg.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::models {

struct BuildOptions {
  // Seed of the initial parameter values. (optional) defaults to 0.
  TORCH_ARG(uint64_t, seed) = 0;
  // (optional) Called after each FSDP unit is built and initialized. Defaults to none.
  TORCH_ARG(UnitBuiltCallback, on_unit_built) = nullptr;
  // Every unit runs its forward under fsdp::checkpoint. (optional) defaults to false.
  TORCH_ARG(bool, activation_checkpoint) = false;
};

// A built model.
class Model {
 public:
  virtual ~Model() = default;
  // The whole model (every parameter, under its Hugging Face name).
  virtual std::shared_ptr<torch::nn::Module> root() const = 0;
  // The FSDP units in forward order, with their names (as on_unit_built got them).
  virtual std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> units() const = 0;
  // The output projection (tied to the embeddings or not), called through fsdp::forward or
  // fsdp::linear, so that it may be an FSDP unit of its own (fsdp-train --head-unit).
  virtual std::shared_ptr<torch::nn::Module> head() const = 0;
  // idx: [B, T] int64 token ids. Returns logits [B, T, vocab_size]. Calls the root through
  // fsdp::forward (a plain call when it is not sharded).
  virtual at::Tensor forward(const at::Tensor& idx) = 0;
  // Mean cross-entropy (in nats) of logits [B, T, V] against targets [B, T].
  virtual at::Tensor loss(const at::Tensor& logits, const at::Tensor& targets) const;
  // Summed cross-entropy (in nats) over the targets that are not -100 (fine-tuning data's
  // masked positions); the trainer divides it by the batch's count of trained targets.
  virtual at::Tensor summed_loss(const at::Tensor& logits, const at::Tensor& targets) const;
  virtual void set_activation_checkpoint(bool on) = 0;
};

// Changes to a named configuration's sizes; 0 keeps the configuration's own value. Each family
// maps them to its fields (GPT-2: n_embd, n_layer, n_head, n_positions; Llama: hidden_size,
// num_hidden_layers, num_attention_heads, max_position_embeddings).
struct SizeOverrides {
  int64_t vocab_size = 0;
  int64_t max_seq_len = 0;
  int64_t dim = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
};

// One named configuration of a model family.
class ModelSpec {
 public:
  virtual ~ModelSpec() = default;
  virtual std::string name() const = 0;    // as --model takes it: "gpt2", "llama-8b", ...
  virtual std::string family() const = 0;  // the folder: "gpt2", "llama"
  // Distinct parameter elements (a tied weight counted once).
  virtual int64_t num_parameters() const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t max_seq_len() const = 0;  // longest sequence forward accepts
  // The configuration's sizes under the family's own names, for reports (fsdp-estimate).
  virtual std::vector<std::pair<std::string, int64_t>> sizes() const = 0;
  // This configuration with sizes changed. Throws naming the values if the result is invalid.
  virtual std::shared_ptr<const ModelSpec> with_overrides(const SizeOverrides& overrides) const = 0;
  virtual std::unique_ptr<Model> build(const BuildOptions& options) const = 0;
  // Hugging Face names and layout of a full checkpoint (model.safetensors) of this model.
  virtual checkpoint::FullLayout hf_layout() const = 0;
  // The config.json that the family's transformers class loads beside model.safetensors whose
  // tensors are stored in dtype.
  virtual std::string hf_config_json(at::ScalarType dtype) const = 0;
  // The model as the memory estimator sees it, for one rank's micro_batch sequences of seq_len
  // tokens computed in compute_dtype; under tensor parallelism over tp ranks (unit_tp_plan and
  // root_tp_plan, with or without sequence parallelism), one rank's slices of the units, their
  // activations and their tensor-parallel communication. Throws naming sizes that do not divide.
  virtual ModelMemorySpec memory_spec(int64_t micro_batch, int64_t seq_len,
                                      at::ScalarType compute_dtype, bool activation_checkpoint,
                                      int tp, bool sequence_parallel) const = 0;
  ModelMemorySpec memory_spec(int64_t micro_batch, int64_t seq_len, at::ScalarType compute_dtype,
                              bool activation_checkpoint) const {
    return memory_spec(micro_batch, seq_len, compute_dtype, activation_checkpoint, 1, false);
  }
  // How each unit (as on_unit_built hands it out) is split by tensor parallelism over tp ranks,
  // with or without sequence parallelism: parallelize_module's plan, paths relative to the unit.
  // Throws naming the sizes that do not divide by tp. The default throws: the family has no plan.
  virtual TensorParallelPlan unit_tp_plan(int tp, bool sequence_parallel) const;
  // The root's plan (embeddings, final norm, head; applied after the units'), paths relative to
  // the root: under sequence parallelism, where the sequence is split and gathered again. The
  // default: empty without sequence parallelism, and throws with it.
  virtual TensorParallelPlan root_tp_plan(int tp, bool sequence_parallel) const;
};

// The registered configuration called name; throws listing every registered name otherwise.
std::shared_ptr<const ModelSpec> model_spec(const std::string& name);
// Every registered configuration name, family by family, in registration order.
std::vector<std::string> model_names();
// model_names() joined with ", " (for help texts and errors).
std::string model_names_joined();

// --- models from a Hugging Face directory (models/hf/) ---

// The model described by DIR/config.json (a Hugging Face checkpoint directory, as
// save_pretrained writes it), for the transformers classes LlamaForCausalLM,
// MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM and GPT2LMHeadModel. Every field that
// changes the computation is honoured or the file is refused naming it (models/hf/hf_config.h).
// The spec's name() is DIR's last component; hf_layout() is the class's file layout (its tied or
// untied head, biases, q/k norms), so checkpoint::load_full(DIR, ...) loads DIR's weights;
// hf_config_json(dtype) is DIR's config.json with every field kept, torch_dtype (and dtype, if
// the file has it) set to dtype, architectures to the class, and the sizes to this spec's (they
// differ after with_overrides). Throws c10::Error naming the file, the field and the value.
std::shared_ptr<const ModelSpec> model_spec_from_pretrained(const std::string& dir);

// Whether path is a directory holding a config.json (what model_spec_from_pretrained reads).
bool is_pretrained_dir(const std::string& path);

// What a program's --model names: a registered configuration (model_spec) if name_or_dir is
// one, else a Hugging Face directory (model_spec_from_pretrained). Throws listing the registered
// names when it is neither.
std::shared_ptr<const ModelSpec> resolve_model_spec(const std::string& name_or_dir);

}  // namespace fsdp::models
