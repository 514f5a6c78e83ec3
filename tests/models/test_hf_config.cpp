// Models from a Hugging Face config.json, in process (no Python; transformers' side is
// test_hf_families.cpp): what each family reads and defaults as transformers' config classes
// do, the spec's parameters against its memory spec and the built model, the config.json it
// writes back (every field kept), the resolver programs use for --model, the sliding-window
// limit, and broken or hostile files each refused naming the field and the value.
#include <fsdp/fully_shard.h>
#include <fsdp/models/model.h>
#include <models/hf/hf_config.h>

#include "support/checkpoint_util.h"
#include "support/test_support.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <functional>

namespace fsdp::models {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

json llama_json() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", 128},
          {"hidden_size", 64},
          {"intermediate_size", 96},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"max_position_embeddings", 64},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 10000.0},
          {"bos_token_id", 1},
          {"eos_token_id", {2, 3}},
          {"pad_token_id", nullptr},
          {"attention_dropout", 0.0},
          {"transformers_version", "4.45.0"},
          {"torch_dtype", "bfloat16"}};
}

json gpt2_json() {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", 100},
          {"n_positions", 32},
          {"n_embd", 32},
          {"n_layer", 2},
          {"n_head", 4},
          {"attn_pdrop", 0.1},
          {"summary_type", "cls_index"}};
}

// A directory holding config as config.json.
std::string config_dir(const std::string& name, const json& config) {
  const std::string dir = test::temp_dir(name);
  std::ofstream(dir + "/config.json") << config.dump(2);
  return dir;
}

std::string refusal_of_text(const std::string& text) {
  try {
    parse_hf_config(text);
  } catch (const HfConfigError& e) {
    return e.what();
  }
  return "no error";
}

std::string refusal(const json& config) { return refusal_of_text(config.dump()); }

TEST(HfConfig, FamiliesReadTheirFieldsWithTransformersDefaults) {
  const HfConfig llama = parse_hf_config(llama_json().dump());
  ASSERT_TRUE(llama.llama);
  EXPECT_EQ(llama.class_name, "LlamaForCausalLM");
  EXPECT_EQ(llama.llama->head_dim(), 16);
  EXPECT_FALSE(llama.llama->tie_word_embeddings);
  EXPECT_EQ(llama.llama->attention_bias, AttentionBias::kNone);

  json mistral = llama_json();
  mistral["architectures"] = {"MistralForCausalLM"};
  mistral["model_type"] = "mistral";
  mistral.erase("num_key_value_heads");  // MistralConfig's default is 8
  mistral["num_attention_heads"] = 8;
  mistral["sliding_window"] = 32;
  const HfConfig m = parse_hf_config(mistral.dump());
  EXPECT_EQ(m.llama->num_key_value_heads, 8);
  EXPECT_EQ(m.llama->sliding_window, 32);
  EXPECT_EQ(m.llama->max_seq_len(), 32);
  mistral["sliding_window"] = 64;  // spans every position: no effect
  EXPECT_EQ(parse_hf_config(mistral.dump()).llama->sliding_window, 0);

  json qwen2 = llama_json();
  qwen2.erase("architectures");  // model_type alone decides
  qwen2["model_type"] = "qwen2";
  qwen2["use_sliding_window"] = false;
  qwen2["sliding_window"] = 4;  // ignored, as transformers does without use_sliding_window
  const HfConfig q2 = parse_hf_config(qwen2.dump());
  EXPECT_EQ(q2.class_name, "Qwen2ForCausalLM");
  EXPECT_EQ(q2.llama->attention_bias, AttentionBias::kQkv);
  EXPECT_EQ(q2.llama->sliding_window, 0);

  json qwen3 = llama_json();
  qwen3["architectures"] = {"Qwen3ForCausalLM"};
  qwen3["model_type"] = "qwen3";
  const HfConfig q3 = parse_hf_config(qwen3.dump());
  EXPECT_TRUE(q3.llama->qk_norm);
  EXPECT_EQ(q3.llama->head_dim(), 128);  // Qwen3Config's default head_dim

  // transformers 5's spelling: rope_parameters with rope_theta inside.
  json v5 = llama_json();
  v5.erase("rope_theta");
  v5["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 4.0}, {"rope_theta", 1e6}};
  const HfConfig r = parse_hf_config(v5.dump());
  EXPECT_EQ(r.llama->rope_theta, 1e6);
  ASSERT_TRUE(r.llama->rope_scaling);
  EXPECT_EQ(r.llama->rope_scaling->rope_type, RopeType::kLinear);
  EXPECT_EQ(r.llama->rope_scaling->factor, 4.0);

  const HfConfig g = parse_hf_config(gpt2_json().dump());
  ASSERT_TRUE(g.gpt2);
  EXPECT_TRUE(g.gpt2->tie_word_embeddings);
  EXPECT_EQ(g.gpt2->inner_size(), 128);
  EXPECT_EQ(g.gpt2->activation_function, Activation::kGeluTanh);
}

// Each family's spec: its parameters (those of the built model, with the family's extra ones)
// are the memory spec's, unit by unit in forward order.
TEST(HfConfig, SpecsCountTheParametersTheyBuild) {
  json qwen3 = llama_json();
  qwen3["architectures"] = {"Qwen3ForCausalLM"};
  qwen3["model_type"] = "qwen3";
  qwen3["head_dim"] = 24;
  qwen3["attention_bias"] = true;
  json qwen2 = llama_json();
  qwen2["architectures"] = {"Qwen2ForCausalLM"};
  qwen2["model_type"] = "qwen2";
  qwen2["tie_word_embeddings"] = true;
  json gpt2 = gpt2_json();
  gpt2["tie_word_embeddings"] = false;
  gpt2["n_inner"] = 40;
  const std::vector<std::pair<json, std::vector<std::string>>> cases = {
      {qwen3, {"model.layers.1.self_attn.q_norm.weight", "model.layers.0.self_attn.o_proj.bias"}},
      {qwen2, {"model.layers.1.self_attn.v_proj.bias"}},
      {gpt2, {"lm_head.weight", "transformer.h.1.mlp.c_fc.bias"}}};
  for (const auto& [config, names] : cases) {
    SCOPED_TRACE(config.dump());
    const auto spec = model_spec_from_pretrained(config_dir("spec", config));
    auto model = spec->build(BuildOptions().seed(1));
    EXPECT_EQ(test::distinct_numel(*model->root()), spec->num_parameters());
    const ModelMemorySpec memory = spec->memory_spec(2, 8, at::kFloat, false);
    ASSERT_EQ(memory.units.size(), model->units().size());
    for (size_t i = 0; i < memory.units.size(); ++i) {
      std::vector<std::vector<int64_t>> shapes;
      for (const auto& p : model->units()[i].second->parameters())
        shapes.push_back(p.sizes().vec());
      EXPECT_EQ(memory.units[i].param_shapes, shapes);
    }
    const auto params = model->root()->named_parameters();
    for (const auto& name : names) EXPECT_TRUE(params.contains(name)) << name;
    at::NoGradGuard no_grad;
    EXPECT_EQ(model->forward(at::zeros({2, 8}, at::kLong)).sizes(),
              at::IntArrayRef({2, 8, spec->vocab_size()}));
  }
}

TEST(HfConfig, ConfigJsonKeepsEveryFieldAndSetsDtypeAndSizes) {
  json original = llama_json();
  original["dtype"] = "bfloat16";  // transformers 5 writes dtype
  original["some_tool_field"] = {{"nested", true}};
  const std::string dir = config_dir("SmolThing-1B", original);
  const auto spec = model_spec_from_pretrained(dir);
  EXPECT_EQ(spec->name(), dir.substr(dir.rfind('/') + 1));  // the directory's name
  EXPECT_THAT(spec->name(), HasSubstr("SmolThing-1B"));
  const json out = json::parse(spec->hf_config_json(at::kFloat));
  for (const auto& [key, value] : original.items()) {
    if (key == "torch_dtype" || key == "dtype") continue;
    EXPECT_EQ(out.at(key), value) << key;
  }
  EXPECT_EQ(out.at("torch_dtype"), "float32");
  EXPECT_EQ(out.at("dtype"), "float32");
  EXPECT_EQ(out.at("architectures"), json::array({"LlamaForCausalLM"}));
  // Overridden sizes reach the file; a key the file left to its default is written too, so
  // that transformers does not derive it from the changed size.
  SizeOverrides o;
  o.vocab_size = 300;
  o.n_heads = 8;
  json sparse = llama_json();
  sparse.erase("num_key_value_heads");  // defaults to num_attention_heads = 4
  const json resized = json::parse(model_spec_from_pretrained(config_dir("sparse", sparse))
                                       ->with_overrides(o)
                                       ->hf_config_json(at::kBFloat16));
  EXPECT_EQ(resized.at("vocab_size"), 300);
  EXPECT_EQ(resized.at("num_attention_heads"), 8);
  EXPECT_EQ(resized.at("num_key_value_heads"), 4);
  EXPECT_EQ(resized.at("torch_dtype"), "bfloat16");
}

TEST(HfConfig, ResolverTakesRegisteredNamesAndDirectories) {
  EXPECT_EQ(resolve_model_spec("llama-tiny")->name(), "llama-tiny");
  const std::string dir = config_dir("resolve", gpt2_json());
  EXPECT_TRUE(is_pretrained_dir(dir));
  EXPECT_FALSE(is_pretrained_dir(dir + "/config.json"));
  EXPECT_EQ(resolve_model_spec(dir)->family(), "gpt2");
  const std::string unknown = test::error_message([] { resolve_model_spec("gpt5"); });
  EXPECT_THAT(unknown, HasSubstr("'gpt5'"));
  EXPECT_THAT(unknown, HasSubstr(model_names_joined()));
  EXPECT_THAT(unknown, HasSubstr("config.json"));
  const std::string empty = test::temp_dir("empty_model_dir");
  EXPECT_THAT(test::error_message([&] { resolve_model_spec(empty); }),
              HasSubstr("has no config.json"));
}

TEST(HfConfig, SlidingWindowLimitsTheSequence) {
  json mistral = llama_json();
  mistral["architectures"] = {"MistralForCausalLM"};
  mistral["model_type"] = "mistral";
  mistral["sliding_window"] = 8;
  const auto spec = model_spec_from_pretrained(config_dir("window", mistral));
  EXPECT_EQ(spec->max_seq_len(), 8);
  auto model = spec->build(BuildOptions().seed(1));
  at::NoGradGuard no_grad;
  EXPECT_EQ(model->forward(at::zeros({1, 8}, at::kLong)).size(1), 8);
  EXPECT_THAT(test::error_message([&] {
                model->forward(at::zeros({1, 9}, at::kLong));
              }),
              HasSubstr("exceeds the model's sliding_window=8"));
}

// Each case: a change to a valid config.json and what the refusal must say.
struct Refusal {
  std::function<void(json&)> change;
  std::vector<std::string> says;
};

// Sizes and types.
std::vector<Refusal> size_refusals() {
  return {
      {[](json& c) { c.erase("hidden_size"); },
       {"config.json: hidden_size is missing (LlamaForCausalLM needs it)"}},
      {[](json& c) { c["hidden_size"] = "64"; }, {"hidden_size must be an integer, got \"64\""}},
      {[](json& c) { c["num_hidden_layers"] = 1.5; },
       {"num_hidden_layers must be an integer", "1.5"}},
      {[](json& c) { c["num_attention_heads"] = -4; }, {"num_attention_heads=-4 is out of range"}},
      {[](json& c) { c["vocab_size"] = 1000000000000; },
       {"vocab_size=1000000000000 is out of range"}},
      {[](json& c) { c["hidden_size"] = 50; },
       {"hidden_size=50 is not divisible by num_attention_heads=4"}},
      {[](json& c) { c["num_key_value_heads"] = 3; },
       {"num_attention_heads=4 is not divisible by num_key_value_heads=3"}},
      {[](json& c) { c["head_dim"] = 7; }, {"head_dim=7", "must be even"}},
      {[](json& c) {
         c["vocab_size"] = 1 << 24;
         c["hidden_size"] = 1 << 24;
       },
       {"more than 2^46"}},
  };
}

// Values and features not implemented, and the class.
std::vector<Refusal> feature_refusals() {
  return {
      {[](json& c) { c["rms_norm_eps"] = -1; }, {"rms_norm_eps=", "must be positive"}},
      {[](json& c) { c["rope_theta"] = 0; }, {"rope_theta=", "must be positive"}},
      {[](json& c) { c["tie_word_embeddings"] = "yes"; },
       {"tie_word_embeddings must be true or false"}},
      {[](json& c) { c["hidden_act"] = "relu"; }, {"hidden_act \"relu\" is not implemented"}},
      {[](json& c) {
         c["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
       },
       {"rope_scaling.rope_type \"yarn\" is not implemented"}},
      {[](json& c) {
         c["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
       },
       {"rope_type \"dynamic\" is not implemented"}},
      {[](json& c) {
         c["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 8.0}, {"high_freq_factor", 4.0}};
       },
       {"rope_scaling.low_freq_factor is missing"}},
      {[](json& c) {
         c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", -2.0}};
       },
       {"rope_scaling.factor=", "must be positive"}},
      {[](json& c) {
         c["rope_parameters"] = {{"full_attention", {{"rope_type", "default"}}}};
       },
       {"rope_parameters.full_attention", "per layer type"}},
      {[](json& c) { c["partial_rotary_factor"] = 0.5; }, {"partial_rotary_factor=0.5"}},
      {[](json& c) { c["attn_logit_softcapping"] = 50.0; }, {"attn_logit_softcapping=50.0"}},
      {[](json& c) {
         c["quantization_config"] = {{"quant_method", "gptq"}};
       },
       {"quantization_config="}},
      {[](json& c) { c["rope_interleaved"] = true; }, {"rope_interleaved=true"}},
      {[](json& c) {
         c["layer_types"] = {"full_attention", "sliding_attention"};
       },
       {"layer_types[1]=\"sliding_attention\""}},
      {[](json& c) { c["architectures"] = {"GemmaForCausalLM"}; },
       {"architectures names \"GemmaForCausalLM\"", "LlamaForCausalLM, MistralForCausalLM"}},
      {[](json& c) {
         c["architectures"] = {"LlamaForCausalLM", "LlamaModel"};
       },
       {"architectures must name one class"}},
      {[](json& c) { c["model_type"] = "qwen2"; },
       {"architectures names LlamaForCausalLM but model_type is \"qwen2\""}},
      {[](json& c) {
         c.erase("architectures");
         c.erase("model_type");
       },
       {"names neither architectures nor model_type"}},
  };
}

TEST(HfConfig, BrokenConfigsAreRefusedNamingTheFieldAndValue) {
  std::vector<Refusal> refusals = size_refusals();
  for (auto& r : feature_refusals()) refusals.push_back(std::move(r));
  for (const auto& r : refusals) {
    json config = llama_json();
    r.change(config);
    const std::string message = refusal(config);
    SCOPED_TRACE(config.dump());
    for (const auto& part : r.says) EXPECT_THAT(message, HasSubstr(part));
  }
  json qwen2 = llama_json();
  qwen2["architectures"] = {"Qwen2ForCausalLM"};
  qwen2["model_type"] = "qwen2";
  qwen2["use_sliding_window"] = true;
  qwen2["sliding_window"] = 16;
  qwen2["max_window_layers"] = 1;
  EXPECT_THAT(refusal(qwen2), HasSubstr("use_sliding_window=true with sliding_window=16"));
  qwen2["max_window_layers"] = 2;  // no layer from 2 on: no window anywhere
  EXPECT_EQ(refusal(qwen2), "no error");
  const std::vector<std::pair<std::function<void(json&)>, std::string>> gpt2 = {
      {[](json& c) { c["scale_attn_by_inverse_layer_idx"] = true; },
       "scale_attn_by_inverse_layer_idx=true is not implemented"},
      {[](json& c) { c["reorder_and_upcast_attn"] = true; }, "reorder_and_upcast_attn=true"},
      {[](json& c) { c["add_cross_attention"] = true; }, "add_cross_attention=true"},
      {[](json& c) { c["scale_attn_weights"] = false; }, "scale_attn_weights=false"},
      {[](json& c) { c["n_embd"] = 50; }, "n_embd=50 is not divisible by n_head=4"},
      {[](json& c) { c["activation_function"] = "gelu"; },
       "activation_function \"gelu\" is not implemented"},
      {[](json& c) { c.erase("n_positions"); }, "n_positions is missing"},
  };
  for (const auto& [change, says] : gpt2) {
    json config = gpt2_json();
    change(config);
    EXPECT_THAT(refusal(config), HasSubstr(says)) << config.dump();
  }
}

TEST(HfConfig, HostileTextIsRefused) {
  EXPECT_THAT(refusal_of_text("{\"vocab_size\": 12"), HasSubstr("config.json is not valid JSON"));
  EXPECT_THAT(refusal_of_text("[1, 2]"), HasSubstr("is not a JSON object"));
  EXPECT_THAT(refusal_of_text("{\"hidden_size\": 1, \"hidden_size\": 2}"),
              HasSubstr("has the key \"hidden_size\" twice"));
  EXPECT_THAT(refusal_of_text(std::string(1000, '[') + std::string(1000, ']')),
              HasSubstr("nests deeper"));
  EXPECT_THAT(refusal_of_text("{\"x\": \"" + std::string(2 << 20, 'a') + "\"}"),
              HasSubstr("more than the 1048576 accepted"));
  EXPECT_THAT(refusal_of_text("{\"rope_theta\": NaN}"), HasSubstr("config.json is not valid JSON"));
  // Through a directory, the message names the file.
  json broken = llama_json();
  broken["num_key_value_heads"] = 0;
  const std::string dir = config_dir("broken", broken);
  const std::string message = test::error_message([&] { model_spec_from_pretrained(dir); });
  EXPECT_THAT(message, HasSubstr(dir + "/config.json: num_key_value_heads=0 is out of range"));
}

}  // namespace
}  // namespace fsdp::models
