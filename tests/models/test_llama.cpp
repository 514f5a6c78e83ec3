// Llama model tests: transformers' names and shapes, parameter counts against the published
// figures, the rotary frequencies' three bands under Llama 3.1 scaling, grouped-query attention
// against the same model with its key/value heads duplicated, causality, tied embeddings, the
// deterministic initialization deferred construction relies on, and the memory spec's saved
// bytes against the counting allocator. Unsharded; fsdp::forward is a plain call. (Logits
// against transformers: tests/checkpoint/test_llama_hf.cpp.)
#include <fsdp/util/memory_counter.h>
#include <models/llama/llama.h>
#include <models/llama/llama_memory.h>

#include "support/test_support.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <thread>
#include <vector>

namespace fsdp::models {
namespace {

void expect_same_parameters(const torch::nn::Module& a, const torch::nn::Module& b) {
  auto pa = a.named_parameters();
  auto pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].key(), pb[i].key());
    EXPECT_TRUE(at::equal(pa[i].value(), pb[i].value())) << pa[i].key();
  }
}

TEST(Llama, TinyHasExactlyTransformersNamesAndShapes) {
  LlamaForCausalLM model(LlamaConfig::tiny());
  std::vector<std::string> names;
  for (const auto& item : model->named_parameters()) names.push_back(item.key());
  std::vector<std::string> want = {"model.embed_tokens.weight"};
  for (int i = 0; i < 2; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    for (const char* rest :
         {"input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
          "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
          "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"}) {
      want.push_back(p + rest);
    }
  }
  want.push_back("model.norm.weight");
  want.push_back("lm_head.weight");
  EXPECT_EQ(names, want);
  EXPECT_TRUE(model->named_buffers().is_empty());
  auto params = model->named_parameters();
  EXPECT_EQ(params["model.layers.1.self_attn.q_proj.weight"].sizes(), at::IntArrayRef({32, 32}));
  EXPECT_EQ(params["model.layers.1.self_attn.k_proj.weight"].sizes(), at::IntArrayRef({16, 32}));
  EXPECT_EQ(params["model.layers.1.self_attn.v_proj.weight"].sizes(), at::IntArrayRef({16, 32}));
  EXPECT_EQ(params["model.layers.1.mlp.gate_proj.weight"].sizes(), at::IntArrayRef({64, 32}));
  EXPECT_EQ(params["model.layers.1.mlp.down_proj.weight"].sizes(), at::IntArrayRef({32, 64}));
  EXPECT_EQ(params["lm_head.weight"].sizes(), at::IntArrayRef({256, 32}));
  EXPECT_NE(params["lm_head.weight"].unsafeGetTensorImpl(),
            params["model.embed_tokens.weight"].unsafeGetTensorImpl());
}

TEST(Llama, ParameterCountsMatchPublishedFigures) {
  // torchtitan's debug model: int(2 * 4 * 256 / 3) = 682, rounded up to a multiple of 256.
  EXPECT_EQ(llama_ffn_hidden_size(256, 256), 768);
  EXPECT_EQ(LlamaConfig::debug().intermediate_size, 768);
  EXPECT_EQ(num_parameters(LlamaConfig::tiny()), 34976);
  EXPECT_EQ(num_parameters(LlamaConfig::debug()), 6163712);
  EXPECT_EQ(num_parameters(LlamaConfig::llama3_2_1b()), 1235814400);  // Llama 3.2 1B
  EXPECT_EQ(num_parameters(LlamaConfig::llama3_1_8b()), 8030261248);  // Llama 3.1 8B
  for (const auto& config : {LlamaConfig::tiny(), LlamaConfig::debug()}) {
    LlamaForCausalLM model(config);
    EXPECT_EQ(test::distinct_numel(*model), num_parameters(config));
  }
  LlamaConfig tied = LlamaConfig::tiny();
  tied.tie_word_embeddings = true;
  LlamaForCausalLM model(tied);
  EXPECT_EQ(test::distinct_numel(*model), num_parameters(tied));
  EXPECT_EQ(num_parameters(tied), 34976 - 256 * 32);
}

TEST(Llama, TiedHeadIsTheEmbeddingAndGetsBothGradients) {
  LlamaConfig config = LlamaConfig::tiny();
  config.tie_word_embeddings = true;
  LlamaForCausalLM model(LlamaOptions(config).seed(2));
  auto params = model->named_parameters();
  const at::Tensor& embed = params["model.embed_tokens.weight"];
  EXPECT_EQ(params["lm_head.weight"].unsafeGetTensorImpl(), embed.unsafeGetTensorImpl());
  at::Tensor idx = at::arange(8, at::kLong).view({1, 8});
  loss(model->forward(idx), (idx + 1) % 256).backward();
  ASSERT_TRUE(embed.grad().defined());
  EXPECT_GT(embed.grad()[200].abs().sum().item<float>(), 0.0f);  // only through lm_head
}

TEST(Llama, RopeScalingStretchesLowFrequenciesAndBlendsTheBand) {
  // tiny: head_dim 8, theta 500000 -> wavelengths 6.3, 167, 4443, 118000; scaling with
  // original 256, low 1, high 4 keeps < 64, divides > 256 by 8 and blends [64, 256].
  LlamaConfig plain = LlamaConfig::tiny();
  plain.rope_scaling.reset();
  const at::Tensor base = llama_inv_freq(plain).to(at::kDouble);
  const at::Tensor scaled = llama_inv_freq(LlamaConfig::tiny()).to(at::kDouble);
  ASSERT_EQ(base.numel(), 4);
  for (int i = 0; i < 4; ++i) {
    const double want = std::pow(500000.0, -2.0 * i / 8);
    EXPECT_NEAR(base[i].item<double>(), want, want * 1e-6) << i;
  }
  EXPECT_EQ(scaled[0].item<double>(), base[0].item<double>());
  const double wavelen = 2 * M_PI / base[1].item<double>();
  const double smooth = (256.0 / wavelen - 1.0) / (4.0 - 1.0);
  const double blended =
      (1 - smooth) * base[1].item<double>() / 8 + smooth * base[1].item<double>();
  EXPECT_NEAR(scaled[1].item<double>(), blended, blended * 1e-6);
  EXPECT_GT(smooth, 0.0);
  EXPECT_LT(smooth, 1.0);
  EXPECT_NEAR(scaled[2].item<double>(), base[2].item<double>() / 8, base[2].item<double>() * 1e-7);
  EXPECT_NEAR(scaled[3].item<double>(), base[3].item<double>() / 8, base[3].item<double>() * 1e-7);
}

TEST(Llama, GroupedQueryAttentionEqualsDuplicatedKeyValueHeads) {
  // 4 query heads over 2 key/value heads: query heads 0, 1 read kv head 0, heads 2, 3 kv head 1.
  // The same model with 4 kv heads whose k_proj / v_proj rows repeat each head twice must give
  // the same logits.
  const LlamaConfig grouped = LlamaConfig::tiny();
  LlamaConfig full = grouped;
  full.num_key_value_heads = full.num_attention_heads;
  LlamaForCausalLM a(LlamaOptions(grouped).seed(5));
  LlamaForCausalLM b(LlamaOptions(full).seed(6));
  {
    at::NoGradGuard no_grad;
    auto pa = a->named_parameters();
    const int64_t hd = grouped.head_dim();
    for (auto& item : b->named_parameters()) {
      const at::Tensor src = pa[item.key()];
      at::Tensor dst = item.value();
      if (src.sizes() == dst.sizes()) {
        dst.copy_(src);
      } else {  // k_proj / v_proj: [2 * hd, d] -> [4 * hd, d], each head twice
        dst.copy_(src.view({2, 1, hd, -1}).expand({2, 2, hd, src.size(1)}).reshape(dst.sizes()));
      }
    }
  }
  at::NoGradGuard no_grad;
  const at::Tensor idx = (at::arange(2 * 12, at::kLong).view({2, 12}) * 29 + 3) % 256;
  const at::Tensor la = a->forward(idx), lb = b->forward(idx);
  EXPECT_LE((la - lb).abs().max().item<double>(), 1e-5);
  EXPECT_GT(la.abs().max().item<double>(), 1e-3);
}

TEST(Llama, LogitsAtAPositionDoNotDependOnLaterTokens) {
  LlamaForCausalLM model(LlamaOptions(LlamaConfig::tiny()).seed(11));
  at::NoGradGuard no_grad;
  at::Tensor idx = at::randint(0, 256, {2, 20}, at::kLong);
  at::Tensor before = model->forward(idx);
  const int64_t t = 9;
  at::Tensor changed = idx.clone();
  changed.select(1, t).copy_((idx.select(1, t) + 1) % 256);
  at::Tensor after = model->forward(changed);
  EXPECT_TRUE(at::equal(before.slice(1, 0, t), after.slice(1, 0, t)));
  for (int64_t s = t; s < 20; ++s) {
    EXPECT_FALSE(at::allclose(before.select(1, s), after.select(1, s))) << "position " << s;
  }
  EXPECT_THROW(model->forward(at::zeros({1, 1025}, at::kLong)), c10::Error);
}

TEST(Llama, InitIsPerParameterDeterministicAndDeferredInOrder) {
  const LlamaConfig config = LlamaConfig::tiny();
  at::manual_seed(1);
  LlamaForCausalLM a(LlamaOptions(config).seed(7));
  std::vector<std::string> layers;
  at::manual_seed(2);
  std::vector<LlamaForCausalLM> built(3, LlamaForCausalLM(nullptr));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < built.size(); ++i) {
    threads.emplace_back(
        [&built, &config, i] { built[i] = LlamaForCausalLM(LlamaOptions(config).seed(7)); });
  }
  for (auto& t : threads) t.join();
  for (const auto& m : built) expect_same_parameters(*a, *m);
  LlamaForCausalLM deferred(LlamaOptions(config).seed(7).on_layer_built(
      [&](const std::string& name, const std::shared_ptr<torch::nn::Module>& unit) {
        layers.push_back(name);
        for (const auto& item : unit->named_parameters()) {
          EXPECT_TRUE(at::equal(item.value(), init_parameter(config, name + "." + item.key(),
                                                             item.value().sizes(), 7)));
        }
      }));
  EXPECT_EQ(layers, (std::vector<std::string>{"model.layers.0", "model.layers.1"}));
  expect_same_parameters(*a, *deferred);
  auto params = a->named_parameters();
  EXPECT_TRUE(at::equal(params["model.norm.weight"], at::ones({32})));
  EXPECT_FALSE(at::equal(params["model.layers.0.self_attn.q_proj.weight"],
                         params["model.layers.1.self_attn.q_proj.weight"]));
  const double o_std = params["model.layers.0.self_attn.o_proj.weight"].std().item<double>();
  EXPECT_LT(o_std, 0.02);  // 0.02 / sqrt(2 * 2) = 0.01
  EXPECT_THROW(init_parameter(config, "model.layers.2.mlp.up_proj.weight", {64, 32}, 0),
               c10::Error);
  EXPECT_THROW(init_parameter(config, "model.layers.0.mlp.up_proj.weight", {32, 32}, 0),
               c10::Error);
}

TEST(Llama, ConfigValidationNamesTheValues) {
  LlamaConfig bad = LlamaConfig::tiny();
  bad.num_key_value_heads = 3;
  try {
    LlamaForCausalLM model(bad);
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("num_key_value_heads=3"), std::string::npos) << e.what();
  }
  EXPECT_THROW(LlamaConfig::by_name("llama-70b"), c10::Error);
}

// What forward keeps for backward, measured by the counting allocator, against the spec.
int64_t measured_saved_bytes(const LlamaConfig& config, int64_t batch, int64_t seq,
                             at::ScalarType dtype, bool activation_checkpoint) {
  LlamaForCausalLM model(LlamaOptions(config).seed(1).activation_checkpoint(activation_checkpoint));
  model->to(dtype);
  const at::Tensor idx = at::randint(config.vocab_size, {batch, seq}, at::kLong);
  {
    // A first forward makes the rotary table, which the model then keeps as it keeps a buffer:
    // what the spec counts is what a step's forward adds.
    at::NoGradGuard no_grad;
    model->forward(idx);
  }
  auto counter = std::make_shared<MemoryCounter>();
  CountAllocations count(counter);
  const int64_t before = counter->live_bytes();
  at::Tensor l = loss(model->forward(idx), idx);
  const int64_t held = counter->live_bytes() - before;
  l.backward();
  return held;
}

TEST(LlamaMemorySpec, SavedBytesEqualWhatForwardKeeps) {
  // Qwen3's shape too: q/k norms, an explicit head_dim wider than hidden_size / heads, biases.
  LlamaConfig qwen3 = LlamaConfig::tiny();
  qwen3.qk_norm = true;
  qwen3.explicit_head_dim = 12;
  qwen3.attention_bias = AttentionBias::kAll;
  qwen3.hidden_act = Activation::kGeluTanh;
  for (const int64_t kv_heads : {2, 4, 0}) {  // grouped, not, Qwen3's (grouped)
    for (const auto dtype : {at::kFloat, at::kBFloat16}) {
      for (const bool ckpt : {false, true}) {
        LlamaConfig config = kv_heads == 0 ? qwen3 : LlamaConfig::tiny();
        if (kv_heads != 0) config.num_key_value_heads = kv_heads;
        SCOPED_TRACE(::testing::Message()
                     << (kv_heads == 0 ? "qwen3-like, 2" : std::to_string(kv_heads))
                     << " kv heads, " << dtype << (ckpt ? ", checkpointed" : ""));
        const int64_t batch = 3, seq = 24;
        const ModelMemorySpec spec = llama_memory_spec(config, batch, seq, dtype, ckpt);
        int64_t predicted = spec.root_saved_before_bytes + spec.root_saved_after_bytes;
        for (const auto& unit : spec.units) predicted += unit.saved_bytes;
        // Beyond the spec: the loss and cross-entropy's total weight, two float32 scalars (the
        // loss runs in float32 whatever the logits' dtype).
        const int64_t scalars = 2 * 4;
        EXPECT_EQ(measured_saved_bytes(config, batch, seq, dtype, ckpt), predicted + scalars);
      }
    }
  }
}

}  // namespace
}  // namespace fsdp::models
