// The model plug-in interface (fsdp/models/model.h), for every registered configuration: names are
// unique and resolvable; the parameter count agrees with the parameters the estimator's memory
// spec lists (an independent count of the same shapes) and, for the configurations small
// enough to build here, with the built model; the units handed to on_unit_built are the units()
// in forward order; config.json is JSON naming a transformers architecture.
#include <fsdp/models/model.h>

#include "support/test_support.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace fsdp::models {
namespace {

int64_t numel_of(const std::vector<std::vector<int64_t>>& shapes) {
  int64_t total = 0;
  for (const auto& shape : shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    total += n;
  }
  return total;
}

TEST(ModelRegistry, EveryNameResolvesAndCountsAgreeWithTheMemorySpec) {
  const std::vector<std::string> names = model_names();
  ASSERT_GE(names.size(), 6u);
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const auto spec = model_spec(name);
    EXPECT_EQ(spec->name(), name);
    const ModelMemorySpec memory = spec->memory_spec(1, 8, at::kFloat, false);
    int64_t listed = numel_of(memory.root_param_shapes);
    for (const auto& unit : memory.units) listed += numel_of(unit.param_shapes);
    EXPECT_EQ(listed, spec->num_parameters());
    const auto config = nlohmann::json::parse(spec->hf_config_json(at::kFloat));
    EXPECT_TRUE(config.at("architectures").is_array());
    EXPECT_EQ(config.at("vocab_size").get<int64_t>(), spec->vocab_size());
  }
}

TEST(ModelRegistry, SmallModelsBuildUnitByUnitInForwardOrder) {
  for (const std::string& name : model_names()) {
    const auto spec = model_spec(name);
    if (spec->num_parameters() > 20000000) continue;
    SCOPED_TRACE(name);
    std::vector<std::pair<std::string, torch::nn::Module*>> handed;
    auto model = spec->build(BuildOptions().seed(3).on_unit_built(
        [&](const std::string& unit_name, const std::shared_ptr<torch::nn::Module>& unit) {
          handed.emplace_back(unit_name, unit.get());
        }));
    const auto units = model->units();
    ASSERT_EQ(units.size(), handed.size());
    for (size_t i = 0; i < units.size(); ++i) {
      EXPECT_EQ(units[i].first, handed[i].first);
      EXPECT_EQ(units[i].second.get(), handed[i].second);
      // The unit's parameters are the root's under the unit's name.
      const auto root_params = model->root()->named_parameters();
      for (const auto& item : units[i].second->named_parameters()) {
        const std::string full = units[i].first + "." + item.key();
        ASSERT_TRUE(root_params.contains(full)) << full;
        EXPECT_EQ(root_params[full].unsafeGetTensorImpl(), item.value().unsafeGetTensorImpl());
      }
    }
    EXPECT_EQ(test::distinct_numel(*model->root()), spec->num_parameters());
    at::NoGradGuard no_grad;
    const at::Tensor idx = at::arange(10, at::kLong).view({2, 5});
    EXPECT_EQ(model->forward(idx).sizes(), at::IntArrayRef({2, 5, spec->vocab_size()}));
  }
}

TEST(ModelRegistry, UnknownNameListsTheRegisteredOnes) {
  try {
    model_spec("gpt3");
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'gpt3'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(model_names_joined()), std::string::npos) << msg;
  }
}

TEST(ModelRegistry, OverridesChangeSizesAndAreValidated) {
  SizeOverrides o;
  o.n_layers = 3;
  o.vocab_size = 300;
  const auto spec = model_spec("tiny")->with_overrides(o);
  EXPECT_EQ(spec->vocab_size(), 300);
  EXPECT_EQ(spec->memory_spec(1, 8, at::kFloat, false).units.size(), 3u);
  SizeOverrides bad;
  bad.n_heads = 3;  // 32 is not divisible by 3
  EXPECT_THROW(model_spec("tiny")->with_overrides(bad), c10::Error);
}

TEST(ModelRegistry, LlamaConfigJsonOfThePublishedModels) {
  const auto one = nlohmann::json::parse(model_spec("llama-1b")->hf_config_json(at::kBFloat16));
  EXPECT_EQ(one.at("architectures"), nlohmann::json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(one.at("hidden_size"), 2048);
  EXPECT_EQ(one.at("intermediate_size"), 8192);
  EXPECT_EQ(one.at("num_hidden_layers"), 16);
  EXPECT_EQ(one.at("num_attention_heads"), 32);
  EXPECT_EQ(one.at("num_key_value_heads"), 8);
  EXPECT_EQ(one.at("vocab_size"), 128256);
  EXPECT_EQ(one.at("tie_word_embeddings"), true);
  EXPECT_EQ(one.at("rope_theta"), 500000.0);
  EXPECT_EQ(one.at("rope_scaling").at("rope_type"), "llama3");
  EXPECT_EQ(one.at("rope_scaling").at("factor"), 32.0);
  EXPECT_EQ(one.at("rope_scaling").at("original_max_position_embeddings"), 8192);
  EXPECT_EQ(one.at("torch_dtype"), "bfloat16");
  EXPECT_EQ(one.at("bos_token_id"), 128000);
  EXPECT_EQ(one.at("eos_token_id"), 128001);
  const auto eight = nlohmann::json::parse(model_spec("llama-8b")->hf_config_json(at::kFloat));
  EXPECT_EQ(eight.at("tie_word_embeddings"), false);
  EXPECT_EQ(eight.at("intermediate_size"), 14336);
  EXPECT_EQ(eight.at("rope_scaling").at("factor"), 8.0);
  EXPECT_EQ(eight.at("torch_dtype"), "float32");
  const auto debug = nlohmann::json::parse(model_spec("llama-debug")->hf_config_json(at::kFloat));
  EXPECT_TRUE(debug.at("rope_scaling").is_null());
  EXPECT_EQ(debug.at("num_key_value_heads"), 16);
}

TEST(ModelRegistry, LlamaOverrides) {
  SizeOverrides o;
  o.vocab_size = 512;  // e.g. a tokenizer's
  o.n_layers = 3;
  const auto spec = model_spec("llama-tiny")->with_overrides(o);
  EXPECT_EQ(spec->vocab_size(), 512);
  // 34,976 with 2 layers of 9,280 and 2 x 256 x 32 embeddings.
  EXPECT_EQ(spec->num_parameters(), 34976 + 9280 + 2 * 256 * 32);
  auto model = spec->build(BuildOptions().seed(1));
  EXPECT_EQ(test::distinct_numel(*model->root()), spec->num_parameters());
  EXPECT_EQ(model->units().size(), 3u);
  SizeOverrides bad;
  bad.n_heads = 3;
  EXPECT_THROW(model_spec("llama-tiny")->with_overrides(bad), c10::Error);
}

}  // namespace
}  // namespace fsdp::models
