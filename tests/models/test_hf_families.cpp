// "Bring your own Hugging Face model", against transformers (tests/models/hf_families.py, one
// launch, cached): for each family fsdp builds from a config.json (Llama with llama3 and linear
// rope scaling, biases, tied and untied; Mistral with an explicit head_dim and a sliding window;
// Qwen2's q/k/v biases; Qwen3's q/k norms and explicit head_dim; GPT-2 tied and untied with
// n_inner), and a checkpoint of SmolLM2-135M's shape:
// - our export (hf_config_json + save_full) loads in AutoModelForCausalLM as the class the file
//   names, with no missing or unexpected keys and our logits (1e-5);
// - transformers' random model, saved in bfloat16 shards with an index and a config.json in
//   transformers 5's spelling, built by model_spec_from_pretrained and loaded with load_full,
//   gives transformers' float32 logits and loss within 1e-5 relative;
// - that model trained with FSDP at W = 2 and 4 equals one process (losses, grad norms,
//   parameters, 1e-5), and SmolLM2's shape sharded at W = 2 gives transformers' logits.
#include <fsdp/checkpoint/checkpoint.h>
#include <fsdp/checkpoint/safetensors.h>
#include <fsdp/data/token_shard.h>
#include <fsdp/fully_shard.h>
#include <fsdp/models/model.h>

#include "support/checkpoint_util.h"
#include "support/harness.h"
#include "support/test_support.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <unordered_set>

#ifndef FSDP_SOURCE_DIR
#error "FSDP_SOURCE_DIR must name the source tree (tests/CMakeLists.txt defines it)"
#endif

namespace fsdp::test {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

struct FamilyCase {
  std::string name;
  json config;              // the config.json we start from
  bool export_ours = true;  // also export our random model for transformers to load
  int64_t batch = 4, seq = 16;
  std::string max_shard_size = "20KB";  // transformers' save_pretrained
};

json llama_like(const char* cls, const char* type) {
  return {{"architectures", {cls}},    {"model_type", type},       {"vocab_size", 96},
          {"hidden_size", 48},         {"intermediate_size", 80},  {"num_hidden_layers", 2},
          {"num_attention_heads", 4},  {"num_key_value_heads", 2}, {"max_position_embeddings", 64},
          {"rms_norm_eps", 1e-5},      {"bos_token_id", 1},        {"eos_token_id", 2},
          {"initializer_range", 0.02}, {"use_cache", true},        {"tie_word_embeddings", false}};
}

std::vector<FamilyCase> gpt2_cases();

std::vector<FamilyCase> family_cases() {
  std::vector<FamilyCase> cases;
  json llama = llama_like("LlamaForCausalLM", "llama");  // 4.x spelling: rope_theta + rope_scaling
  llama["num_attention_heads"] = 6;
  llama["rope_theta"] = 500000.0;
  llama["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", 8.0},
                           {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0},
                           {"original_max_position_embeddings", 16}};
  cases.push_back({"llama3_gqa_untied", llama});
  json biased = llama_like("LlamaForCausalLM", "llama");
  biased["num_key_value_heads"] = 4;
  biased["tie_word_embeddings"] = true;
  biased["attention_bias"] = true;
  biased["mlp_bias"] = true;
  biased["hidden_act"] = "gelu_pytorch_tanh";
  biased["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  cases.push_back({"llama_linear_bias_tied", biased});
  json mistral = llama_like("MistralForCausalLM", "mistral");
  mistral["head_dim"] = 16;  // 48 / 4 would be 12
  mistral["sliding_window"] = 32;
  mistral["rope_theta"] = 1e6;
  cases.push_back({"mistral_head_dim_window", mistral});
  json qwen2 = llama_like("Qwen2ForCausalLM", "qwen2");
  qwen2["tie_word_embeddings"] = true;
  qwen2["use_sliding_window"] = false;
  qwen2["sliding_window"] = 64;
  qwen2["max_window_layers"] = 1;
  qwen2["rope_theta"] = 1e6;
  cases.push_back({"qwen2_qkv_bias_tied", qwen2});
  json qwen3 = llama_like("Qwen3ForCausalLM", "qwen3");
  qwen3["head_dim"] = 20;
  qwen3["rms_norm_eps"] = 1e-6;
  qwen3["attention_bias"] = false;
  qwen3["rope_scaling"] = nullptr;
  cases.push_back({"qwen3_qk_norm_head_dim", qwen3});
  for (auto& c : gpt2_cases()) cases.push_back(std::move(c));
  return cases;
}

std::vector<FamilyCase> gpt2_cases() {
  std::vector<FamilyCase> cases;
  const json gpt2 = {{"architectures", {"GPT2LMHeadModel"}},
                     {"model_type", "gpt2"},
                     {"vocab_size", 96},
                     {"n_positions", 32},
                     {"n_ctx", 32},
                     {"n_embd", 48},
                     {"n_layer", 2},
                     {"n_head", 4},
                     {"n_inner", 80},
                     {"activation_function", "gelu_new"},
                     {"layer_norm_epsilon", 1e-5},
                     {"resid_pdrop", 0.1},
                     {"embd_pdrop", 0.1},
                     {"attn_pdrop", 0.1},
                     {"bos_token_id", 95},
                     {"eos_token_id", 95},
                     {"task_specific_params", {{"text-generation", {{"do_sample", true}}}}}};
  cases.push_back({"gpt2_n_inner", gpt2});
  json untied = gpt2;
  untied["tie_word_embeddings"] = false;
  untied["n_inner"] = nullptr;
  untied["activation_function"] = "gelu_pytorch_tanh";
  cases.push_back({"gpt2_untied", untied});
  return cases;
}

// SmolLM2-135M's config.json as the hub has it, with nanotron's extra keys.
FamilyCase smollm2_case() {
  const json config = {{"architectures", {"LlamaForCausalLM"}},
                       {"attention_bias", false},
                       {"attention_dropout", 0.0},
                       {"bos_token_id", 0},
                       {"eos_token_id", 0},
                       {"hidden_act", "silu"},
                       {"hidden_size", 576},
                       {"initializer_range", 0.041666666666666664},
                       {"intermediate_size", 1536},
                       {"is_llama_config", true},
                       {"max_position_embeddings", 8192},
                       {"model_type", "llama"},
                       {"num_attention_heads", 9},
                       {"num_hidden_layers", 30},
                       {"num_key_value_heads", 3},
                       {"pad_token_id", nullptr},
                       {"pretraining_tp", 1},
                       {"rms_norm_eps", 1e-05},
                       {"rope_interleaved", false},
                       {"rope_scaling", nullptr},
                       {"rope_theta", 100000},
                       {"tie_word_embeddings", true},
                       {"torch_dtype", "bfloat16"},
                       {"transformers_version", "4.40.1"},
                       {"use_cache", true},
                       {"vocab_size", 49152}};
  return {"smollm2_135m", config, /*export_ours=*/false, 2, 16, "100MB"};
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

// Every distinct parameter redrawn from (seed, index): weights U(-1, 1) * sqrt(3 / fan_in),
// 1-D weights (norms) 1 + U(-0.1, 0.1), biases U(-0.1, 0.1), so that none is trivial.
void perturb(torch::nn::Module& root, uint64_t seed) {
  at::NoGradGuard no_grad;
  std::unordered_set<const c10::TensorImpl*> seen;
  uint64_t i = 0;
  for (const auto& item : root.named_parameters()) {
    at::Tensor p = item.value();
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
    const bool weight =
        item.key().size() >= 6 && item.key().rfind("weight") == item.key().size() - 6;
    if (p.dim() >= 2) {
      p.copy_(seeded_uniform(p.sizes(), seed + i++, std::sqrt(3.0 / p.size(-1))));
    } else {
      p.copy_(seeded_uniform(p.sizes(), seed + i++, 0.1) + (weight ? 1.0 : 0.0));
    }
  }
}

at::Tensor fixed_ids(int64_t batch, int64_t seq, int64_t vocab) {
  return (at::arange(batch * seq, at::kLong).reshape({batch, seq}) * 37 + 11).remainder(vocab);
}

// Writes ours/<case>: the config.json we export for the spec built from the case's config, the
// case's parameters, and (export_ours) our random model with its logits.
void write_ours(const FamilyCase& c, const std::string& root) {
  const std::string start = root + "/start/" + c.name, ours = root + "/ours/" + c.name;
  ASSERT_TRUE(make_directories(start) && make_directories(ours));
  write_text(start + "/config.json", c.config.dump(2));
  const auto spec = models::model_spec_from_pretrained(start);
  write_text(ours + "/config.json", spec->hf_config_json(at::kFloat));
  write_text(
      ours + "/case.json",
      json{{"seed", 7}, {"batch", c.batch}, {"seq", c.seq}, {"max_shard_size", c.max_shard_size}}
          .dump());
  if (!c.export_ours) return;
  auto model = spec->build(models::BuildOptions().seed(3));
  perturb(*model->root(), 1000);
  const at::Tensor ids = fixed_ids(c.batch, c.seq, spec->vocab_size());
  at::Tensor logits;
  {
    at::NoGradGuard no_grad;
    logits = model->forward(ids);
  }
  // Sharded (with an index) as save_pretrained would split it.
  checkpoint::save_full(
      ours + "/model.safetensors", *model->root(), nullptr,
      checkpoint::ExportOptions().layout(spec->hf_layout()).max_shard_bytes(60000));
  checkpoint::save_safetensors(ours + "/expected.safetensors",
                               {{"input_ids", ids}, {"logits", logits}});
}

class HfFamilies : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = temp_dir("hf_families");
    auto cases = family_cases();
    cases.push_back(smollm2_case());
    for (const auto& c : cases) write_ours(c, root_);
    const std::string ours = root_ + "/ours", theirs = root_ + "/theirs";
    ASSERT_TRUE(make_directories(theirs));
    reference_ = run_reference(reference_python(), {FSDP_SOURCE_DIR "/tests/models/hf_families.py",
                                                    ours + " " + theirs,
                                                    {ours},
                                                    {theirs},
                                                    false,
                                                    600});
    std::cout << reference_.output << (reference_.from_cache ? "(from the reference cache)\n" : "");
  }
  // The SmolLM2-shaped checkpoint is 270 MB: never leave it behind (the reference cache has it).
  static void TearDownTestSuite() { remove_all(root_); }
  void SetUp() override { ASSERT_EQ(reference_.exit_code, 0) << reference_.output; }

  static std::string theirs(const std::string& name) { return root_ + "/theirs/" + name; }

  static inline std::string root_;
  static inline ReferenceResult reference_;
};

// Our model of transformers' checkpoint `name`, unsharded, weights loaded.
std::unique_ptr<models::Model> load_theirs(const std::string& dir,
                                           std::shared_ptr<const models::ModelSpec>& spec) {
  spec = models::model_spec_from_pretrained(dir);
  auto model = spec->build(models::BuildOptions().seed(5));
  checkpoint::load_full(dir, *model->root(), nullptr, spec->hf_layout());
  return model;
}

double relative_difference(const at::Tensor& got, const at::Tensor& want) {
  return ((got - want).abs().max() / want.abs().max()).item<double>();
}

TEST_F(HfFamilies, OurExportsLoadInTransformersWithOurLogits) {
  for (const auto& c : family_cases()) {
    EXPECT_THAT(reference_.output, HasSubstr(c.name + ": our export loads as " +
                                             c.config["architectures"][0].get<std::string>()));
  }
}

// (SmolLM2's shape: below, sharded.)
TEST_F(HfFamilies, TransformersCheckpointsGiveTransformersLogitsAndLoss) {
  for (const auto& c : family_cases()) {
    SCOPED_TRACE(c.name);
    const std::string dir = theirs(c.name);
    ASSERT_TRUE(exists(dir + "/model.safetensors.index.json"));
    std::shared_ptr<const models::ModelSpec> spec;
    const auto model = load_theirs(dir, spec);
    EXPECT_EQ(spec->name(), c.name);
    const auto expected = checkpoint::load_safetensors(dir + "/expected.safetensors");
    at::NoGradGuard no_grad;
    const at::Tensor logits = model->forward(expected.at("input_ids"));
    const double loss = model->loss(logits, expected.at("targets")).item<double>();
    const double want = expected.at("loss").item<double>();
    const double logits_diff = relative_difference(logits, expected.at("logits"));
    std::cout << c.name << ": max relative logits difference " << logits_diff << ", loss " << loss
              << " vs transformers' " << want << "\n";
    EXPECT_LE(logits_diff, 1e-5);
    EXPECT_NEAR(loss, want, 1e-5 * want);
  }
}

// Training the model of transformers' checkpoint dir (its weights loaded on every rank, each
// decoder layer a unit, the root last) on the checkpoint's batch, 2 AdamW steps.
TrainCase family_train_case(const std::string& dir) {
  struct Built {
    std::shared_ptr<const models::ModelSpec> spec;
    std::mutex mu;
    std::map<const torch::nn::Module*, std::shared_ptr<models::Model>> models;  // by root
  };
  auto built = std::make_shared<Built>();
  built->spec = models::model_spec_from_pretrained(dir);
  const auto expected = checkpoint::load_safetensors(dir + "/expected.safetensors");
  TrainCase c;
  c.make_model = [built, dir](const DeviceMesh* mesh) {
    std::shared_ptr<models::Model> model = built->spec->build(models::BuildOptions().seed(5));
    checkpoint::load_full(dir, *model->root(), nullptr, built->spec->hf_layout());
    if (mesh != nullptr) {
      for (const auto& unit : model->units()) fully_shard(unit.second, *mesh);
    }
    std::lock_guard<std::mutex> lock(built->mu);
    built->models[model->root().get()] = model;
    return model->root();
  };
  c.shard = [](const std::shared_ptr<torch::nn::Module>& m, const DeviceMesh& mesh) {
    fully_shard(m, mesh);
  };
  c.loss = [built](const std::shared_ptr<torch::nn::Module>& m, const at::Tensor& x,
                   const at::Tensor& y) {
    std::shared_ptr<models::Model> model;
    {
      std::lock_guard<std::mutex> lock(built->mu);
      model = built->models.at(m.get());
    }
    return model->loss(model->forward(x), y);
  };
  const at::Tensor ids = expected.at("input_ids"), targets = expected.at("targets");
  c.batch = [ids, targets](int64_t) { return std::pair{ids, targets}; };
  c.steps = 2;
  c.lr = 1e-3;
  c.adam_eps = 1e-6;  // the key biases' gradients are rounding noise (see TrainCase::adam_eps)
  return c;
}

TEST_F(HfFamilies, ShardedTrainingEqualsOneProcess) {
  for (const auto& fc : family_cases()) {
    SCOPED_TRACE(fc.name);
    const TrainCase c = family_train_case(theirs(fc.name));
    const TrainRecord reference = train_reference(c);
    for (const int world : {2, 4}) {
      SCOPED_TRACE("W=" + std::to_string(world));
      expect_equivalent(reference, train_sharded(c, world), 1e-5, 1e-5);
    }
  }
}

TEST_F(HfFamilies, SmolLM2ShapeShardedOverTwoRanksGivesTransformersLogits) {
  const std::string dir = theirs("smollm2_135m");
  const auto expected = checkpoint::load_safetensors(dir + "/expected.safetensors");
  const at::Tensor ids = expected.at("input_ids"), want = expected.at("logits");
  const at::Tensor targets = expected.at("targets");
  ASSERT_EQ(ids.size(0), 2);
  std::vector<double> diffs(2, 1.0), losses(2, 0.0);
  ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(60);
  run_ranks_in_threads(
      2,
      [&](std::shared_ptr<ProcessGroup> group) {
        const DeviceMesh mesh(group);
        const auto spec = models::model_spec_from_pretrained(dir);
        EXPECT_EQ(spec->num_parameters(), 134515008);  // SmolLM2-135M's published count
        auto model = spec->build(models::BuildOptions().seed(5).on_unit_built(
            [&](const std::string&, const std::shared_ptr<torch::nn::Module>& unit) {
              fully_shard(unit, mesh);
            }));
        fully_shard(model->root(), mesh);
        checkpoint::load_full(dir, *model->root(), group.get(), spec->hf_layout());
        const int rank = group->rank();
        at::NoGradGuard no_grad;
        EXPECT_EQ(spec->name(), "smollm2_135m");
        const at::Tensor logits = model->forward(ids.narrow(0, rank, 1));
        diffs[rank] = relative_difference(logits, want.narrow(0, rank, 1));
        losses[rank] = model->loss(logits, targets.narrow(0, rank, 1)).item<double>();
      },
      options);
  // Both rows have as many tokens: the batch's mean is the mean of the rows' means.
  const double loss = (losses[0] + losses[1]) / 2, want_loss = expected.at("loss").item<double>();
  std::cout << "SmolLM2-135M's shape at W=2: max relative logits difference " << diffs[0] << ", "
            << diffs[1] << "; loss " << loss << " vs transformers' " << want_loss << "\n";
  EXPECT_LE(diffs[0], 1e-5);
  EXPECT_LE(diffs[1], 1e-5);
  EXPECT_NEAR(loss, want_loss, 1e-5 * want_loss);
}

// fsdp-train --init-from DIR without --model trains DIR's model (its config.json): the losses
// are those of naming the directory with --model too, bit for bit. Its --export copies DIR's
// tokenizer and generation files beside the weights.
TEST_F(HfFamilies, TheTrainerTakesTheModelFromTheInitFromDirectory) {
  const std::string dir = theirs(family_cases().front().name);
  const std::string tokens = root_ + "/tokens.bin";
  std::vector<uint32_t> ids;
  for (uint32_t i = 0; i < 600; ++i) ids.push_back((i * 7 + 3) % 96);  // the cases' vocabulary
  data::write_shard(tokens, ids, data::ShardFormat::kUint16);
  const std::string common = fsdp_train_binary() +
                             " --nproc 2 --steps 2 --global-batch 4 --seq-len 16 --quiet"
                             " --init-from " +
                             dir + " --data " + tokens;
  const std::string named = root_ + "/named.jsonl", implied = root_ + "/implied.jsonl";
  const CommandResult a = run_command(common + " --model " + dir + " --metrics " + named, 240);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const std::string marker = "{\"eos_token\": \"</s>\"}\n";
  write_text(dir + "/special_tokens_map.json", marker);
  const std::string exported = root_ + "/exported";
  ASSERT_TRUE(make_directories(exported));
  const CommandResult b = run_command(
      common + " --metrics " + implied + " --export " + exported + "/model.safetensors", 240);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  EXPECT_EQ(read_bytes(exported + "/special_tokens_map.json"),
            read_bytes(dir + "/special_tokens_map.json"));
  // save_pretrained wrote generation_config.json beside transformers' weights.
  const std::string generation = read_bytes(dir + "/generation_config.json");
  ASSERT_FALSE(generation.empty());
  EXPECT_EQ(read_bytes(exported + "/generation_config.json"), generation);
  const auto want = read_json_lines(named), got = read_json_lines(implied);
  ASSERT_EQ(want.size(), 2u);
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < want.size(); ++s) {
    EXPECT_EQ(got[s]["loss"].get<double>(), want[s]["loss"].get<double>()) << "step " << s + 1;
  }
}

}  // namespace
}  // namespace fsdp::test
