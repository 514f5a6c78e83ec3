// A model's parameters written once: names, shapes and initializers, from which the parameter
// count, the estimator's parameter shapes (memory_spec), the modules' layer sizes and the
// initial values are all derived (llm.c's config struct as the one source). Each family writes
// one function config -> ParamTable (gpt2_params, llama_params); nothing else spells a shape.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace fsdp::models {

enum class InitKind { kNormal, kZeros, kOnes };

struct ParamSpec {
  std::string name;  // the root's own: full name; a layer's: name within the layer
  std::vector<int64_t> shape;
  InitKind init = InitKind::kNormal;
  double std = 0.0;  // kNormal's standard deviation
};

struct ParamTable {
  std::string model;  // for messages: "GPT-2 with n_layer=2"
  // The root's own parameters, in the order the root registers them.
  std::vector<ParamSpec> root;
  // Every layer's parameters ("<layer_prefix><i>.<name>", i < n_layers), in registration order.
  std::string layer_prefix;
  int64_t n_layers = 0;
  std::vector<ParamSpec> layer;
  // Names that are another parameter (a tied lm_head.weight), initialized with its values and
  // counted once: (alias, parameter).
  std::vector<std::pair<std::string, std::string>> tied;

  // name with a tied alias replaced by the parameter it is.
  std::string canonical(const std::string& name) const;
  // The spec of the parameter called name (full name, aliases resolved), or null.
  const ParamSpec* find(const std::string& name) const;
  // The spec of a layer's parameter called local ("mlp.c_fc.weight"), or null if there is none
  // (e.g. a bias the configuration does not have).
  const ParamSpec* layer_param(const std::string& local) const;
  // Distinct parameter elements (aliases not counted).
  int64_t num_parameters() const;
  std::vector<std::vector<int64_t>> root_shapes() const;
  std::vector<std::vector<int64_t>> layer_shapes() const;

  // The initial value of the parameter called name, as a new float32 CPU tensor: kNormal draws
  // from its own generator seeded by seed_for(seed, canonical name), so a tied alias gets its
  // parameter's values. Throws if name is not a parameter or shape is not its full shape.
  at::Tensor initial_value(const std::string& name, at::IntArrayRef shape, uint64_t seed) const;
  // Overwrites every parameter of module (called prefix + its local name) with its initial value.
  void init_module(torch::nn::Module& module, const std::string& prefix, uint64_t seed) const;
};

}  // namespace fsdp::models
