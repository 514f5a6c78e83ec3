// GPT-2 model tests: Hugging Face names, weight tying, parameter counts, causality, and the
// deterministic, order-independent initialization that deferred (unit-by-unit) construction
// and rank threads rely on. Everything here runs unsharded; fsdp::forward is a plain call.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>
#include <models/gpt2/gpt2.h>

#include "support/test_support.h"

#include <cmath>
#include <string>
#include <thread>
#include <vector>

namespace fsdp::models {
namespace {

std::vector<std::string> expected_tiny_names() {
  std::vector<std::string> names = {"transformer.wte.weight", "transformer.wpe.weight"};
  for (int i = 0; i < 2; ++i) {
    const std::string p = "transformer.h." + std::to_string(i) + ".";
    for (const char* rest :
         {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
          "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight",
          "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"}) {
      names.push_back(p + rest);
    }
  }
  names.push_back("transformer.ln_f.weight");
  names.push_back("transformer.ln_f.bias");
  names.push_back("lm_head.weight");
  return names;
}

void expect_same_parameters(const GPT2LMHead& a, const GPT2LMHead& b) {
  auto pa = a->named_parameters();
  auto pb = b->named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].key(), pb[i].key());
    EXPECT_TRUE(at::equal(pa[i].value(), pb[i].value())) << pa[i].key();
  }
}

TEST(GPT2, TinyHasExactlyHuggingFaceNamesAndShapes) {
  GPT2LMHead model(GPT2Config::tiny());
  std::vector<std::string> names;
  for (const auto& item : model->named_parameters()) names.push_back(item.key());
  EXPECT_EQ(names, expected_tiny_names());
  EXPECT_TRUE(model->named_buffers().is_empty());

  auto params = model->named_parameters();
  EXPECT_EQ(params["transformer.wte.weight"].sizes(), at::IntArrayRef({256, 32}));
  EXPECT_EQ(params["transformer.wpe.weight"].sizes(), at::IntArrayRef({64, 32}));
  EXPECT_EQ(params["transformer.h.1.attn.c_attn.weight"].sizes(), at::IntArrayRef({96, 32}));
  EXPECT_EQ(params["transformer.h.1.mlp.c_fc.weight"].sizes(), at::IntArrayRef({128, 32}));
  EXPECT_EQ(params["transformer.h.1.mlp.c_proj.weight"].sizes(), at::IntArrayRef({32, 128}));
  EXPECT_EQ(params["lm_head.weight"].sizes(), at::IntArrayRef({256, 32}));
  EXPECT_EQ(model->transformer->blocks.size(), 2u);
  EXPECT_EQ(model->transformer->h->size(), 2u);
  EXPECT_EQ(model->transformer->h->ptr(1).get(), model->transformer->blocks[1].ptr().get());
}

TEST(GPT2, LmHeadIsTiedToTokenEmbedding) {
  GPT2LMHead model(GPT2Config::tiny());
  auto params = model->named_parameters();
  const at::Tensor& wte = params["transformer.wte.weight"];
  const at::Tensor& head = params["lm_head.weight"];
  EXPECT_EQ(wte.unsafeGetTensorImpl(), head.unsafeGetTensorImpl());
  EXPECT_EQ(model->lm_head->weight.unsafeGetTensorImpl(),
            model->transformer->wte->weight.unsafeGetTensorImpl());

  // Both uses feed one gradient: it must differ from the gradient of the embedding use alone.
  at::Tensor idx = at::arange(8, at::kLong).view({1, 8});
  at::Tensor targets = (idx + 1) % 256;
  loss(model->forward(idx), targets).backward();
  ASSERT_TRUE(wte.grad().defined());
  EXPECT_EQ(head.grad().unsafeGetTensorImpl(), wte.grad().unsafeGetTensorImpl());
  // Rows of tokens that never occur as inputs get gradient only through lm_head.
  EXPECT_GT(wte.grad()[200].abs().sum().item<float>(), 0.0f);
}

TEST(GPT2, ParameterCountsMatchAnalyticCount) {
  EXPECT_EQ(num_parameters(GPT2Config::tiny()), 35712);
  EXPECT_EQ(num_parameters(GPT2Config::small()), 14393088);
  EXPECT_EQ(num_parameters(GPT2Config::gpt2()), 124439808);    // HF's gpt2
  EXPECT_EQ(num_parameters(GPT2Config::medium()), 354823168);  // HF's gpt2-medium
  EXPECT_EQ(num_parameters(GPT2Config::large()), 774030080);   // HF's gpt2-large
  EXPECT_EQ(num_parameters(GPT2Config::xl()), 1557611200);     // HF's gpt2-xl
  for (const std::string& name : GPT2Config::names()) {
    SCOPED_TRACE(name);
    GPT2Config config = GPT2Config::by_name(name);
    // The larger ones are counted above from their published figures; building them would
    // take gigabytes.
    if (num_parameters(config) > 200000000) continue;
    GPT2LMHead model(config);
    EXPECT_EQ(test::distinct_numel(*model), num_parameters(config));
    // LibTorch lists the tied tensor under both names; the count above must not.
    int64_t with_duplicates = 0;
    for (const auto& p : model->parameters()) with_duplicates += p.numel();
    EXPECT_EQ(with_duplicates, num_parameters(config) + config.vocab_size * config.n_embd);
  }
}

TEST(GPT2, ConfigByNameRejectsUnknownNames) {
  EXPECT_EQ(GPT2Config::by_name("small").n_embd, 384);
  try {
    GPT2Config::by_name("gpt3");
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("'gpt3'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("tiny, small, gpt2, gpt2-medium, gpt2-large, gpt2-xl"), std::string::npos)
        << msg;
  }
  GPT2Config bad = GPT2Config::tiny();
  bad.n_head = 3;
  EXPECT_THROW(GPT2LMHead{bad}, c10::Error);
}

TEST(GPT2, ForwardAndBackwardShapes) {
  GPT2LMHead model(GPT2Options(GPT2Config::tiny()).seed(3));
  at::Tensor idx = at::randint(0, 256, {3, 17}, at::kLong);
  at::Tensor logits = model->forward(idx);
  EXPECT_EQ(logits.sizes(), at::IntArrayRef({3, 17, 256}));
  at::Tensor l = loss(logits, at::randint(0, 256, {3, 17}, at::kLong));
  EXPECT_EQ(l.dim(), 0);
  // Small init: the model starts near the uniform prediction, ln 256.
  EXPECT_NEAR(l.item<double>(), std::log(256.0), 0.1);
  l.backward();
  for (const auto& item : model->named_parameters()) {
    ASSERT_TRUE(item.value().grad().defined()) << item.key();
    EXPECT_EQ(item.value().grad().sizes(), item.value().sizes()) << item.key();
  }
  EXPECT_THROW(model->forward(at::zeros({1, 65}, at::kLong)), c10::Error);  // > n_positions
  EXPECT_THROW(model->forward(at::zeros({65}, at::kLong)), c10::Error);     // not [B, T]
}

TEST(GPT2, LossIsMeanCrossEntropy) {
  at::Tensor logits = at::randn({2, 3, 5});
  at::Tensor targets = at::randint(0, 5, {2, 3}, at::kLong);
  at::Tensor logp = at::log_softmax(logits, -1);
  at::Tensor expected = -logp.gather(2, targets.unsqueeze(2)).mean();
  EXPECT_TRUE(at::allclose(loss(logits, targets), expected, 1e-6, 1e-6));
  EXPECT_THROW(loss(logits, targets.view({6})), c10::Error);
}

// As transformers and torchtitan: bf16 / fp16 logits are upcast before the log-softmax, and
// their gradient comes back in their own dtype.
TEST(GPT2, LossRunsInFloat32WhateverTheLogitsDtype) {
  const at::Tensor targets = at::randint(0, 1000, {2, 7}, at::kLong);
  for (const auto dtype : {at::kBFloat16, at::kHalf}) {
    const at::Tensor logits = (at::randn({2, 7, 1000}) * 4).to(dtype).requires_grad_();
    const at::Tensor l = loss(logits, targets);
    EXPECT_EQ(l.scalar_type(), at::kFloat);
    EXPECT_TRUE(at::equal(l, loss(logits.detach().to(at::kFloat), targets)));
    // A log-softmax in bf16 over 1000 classes is off in the third digit.
    const at::Tensor low =
        at::cross_entropy_loss(logits.detach().reshape({-1, 1000}), targets.reshape({-1}));
    EXPECT_NE(low.to(at::kFloat).item<float>(), l.item<float>()) << dtype;
    l.backward();
    EXPECT_EQ(logits.grad().scalar_type(), dtype);
  }
  EXPECT_EQ(loss(at::randn({2, 7, 1000}, at::kDouble), targets).scalar_type(), at::kDouble);
}

TEST(GPT2, LogitsAtAPositionDoNotDependOnLaterTokens) {
  GPT2LMHead model(GPT2Options(GPT2Config::tiny()).seed(11));
  at::NoGradGuard no_grad;
  at::Tensor idx = at::randint(0, 256, {2, 20}, at::kLong);
  at::Tensor before = model->forward(idx);
  const int64_t t = 9;
  at::Tensor changed = idx.clone();
  changed.select(1, t).fill_(0);
  changed.select(1, t).add_(idx.select(1, t) + 1).remainder_(256);
  at::Tensor after = model->forward(changed);
  EXPECT_TRUE(at::equal(before.slice(1, 0, t), after.slice(1, 0, t)));
  // And the change is visible from t on (otherwise the check above proves nothing).
  for (int64_t s = t; s < 20; ++s) {
    EXPECT_FALSE(at::allclose(before.select(1, s), after.select(1, s))) << "position " << s;
  }
}

TEST(GPT2, WholeAndPerParameterInitAreBitIdentical) {
  const uint64_t seed = 1234;
  GPT2LMHead built(GPT2Options(GPT2Config::tiny()).seed(seed));
  GPT2LMHead reinit(GPT2Options(GPT2Config::tiny()).seed(99));
  init_gpt2_parameters(reinit, seed);
  expect_same_parameters(built, reinit);

  // Parameter by parameter, in reverse order, lm_head's name included (it must give wte's
  // values, not new ones).
  GPT2LMHead piecewise(GPT2Options(GPT2Config::tiny()).seed(5));
  auto params = piecewise->named_parameters();
  at::NoGradGuard no_grad;
  for (size_t i = params.size(); i-- > 0;) {
    at::Tensor p = params[i].value();
    p.copy_(init_parameter(GPT2Config::tiny(), params[i].key(), p.sizes(), seed));
  }
  expect_same_parameters(built, piecewise);
}

TEST(GPT2, InitDependsOnSeedOnlyNotOnGlobalGenerator) {
  at::manual_seed(1);
  GPT2LMHead a(GPT2Options(GPT2Config::tiny()).seed(7));
  at::manual_seed(2);
  at::randn({1000});
  GPT2LMHead b(GPT2Options(GPT2Config::tiny()).seed(7));
  expect_same_parameters(a, b);

  GPT2LMHead c(GPT2Options(GPT2Config::tiny()).seed(8));
  auto pa = a->named_parameters();
  auto pc = c->named_parameters();
  int random_params = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    const std::string& name = pa[i].key();
    const bool random =
        name.find("weight") != std::string::npos && name.find("ln_") == std::string::npos;
    if (!random) {
      EXPECT_TRUE(at::equal(pa[i].value(), pc[i].value())) << name;
      continue;
    }
    ++random_params;
    EXPECT_FALSE(at::equal(pa[i].value(), pc[i].value())) << name;
  }
  EXPECT_EQ(random_params, 2 + 2 * 4 + 1);  // wte, wpe, 4 per block, lm_head
  // Distinct parameters of one shape get distinct values (names, not shapes, seed them).
  EXPECT_FALSE(at::equal(pa[2 + 4].value() /*h.0.attn.c_proj.weight*/,
                         pa[14 + 4].value() /*h.1.attn.c_proj.weight*/));
}

TEST(GPT2, ModelsBuiltConcurrentlyOnThreadsAreIdentical) {
  // Ranks run as threads and build their models at the same time.
  GPT2LMHead serial(GPT2Options(GPT2Config::tiny()).seed(21));
  std::vector<GPT2LMHead> built(4, GPT2LMHead(nullptr));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < built.size(); ++i) {
    threads.emplace_back(
        [&built, i] { built[i] = GPT2LMHead(GPT2Options(GPT2Config::tiny()).seed(21)); });
  }
  for (auto& t : threads) t.join();
  for (const auto& model : built) expect_same_parameters(serial, model);
}

TEST(GPT2, InitFollowsGpt2Scheme) {
  GPT2Config config = GPT2Config::small();
  const uint64_t seed = 42;
  auto stddev = [&](const std::string& name, std::vector<int64_t> shape) {
    return init_parameter(config, name, shape, seed).std().item<double>();
  };
  EXPECT_NEAR(stddev("transformer.wte.weight", {256, 384}), 0.02, 0.001);
  EXPECT_NEAR(stddev("transformer.wpe.weight", {256, 384}), 0.01, 0.0005);
  EXPECT_NEAR(stddev("transformer.h.3.attn.c_attn.weight", {1152, 384}), 0.02, 0.001);
  EXPECT_NEAR(stddev("transformer.h.3.mlp.c_fc.weight", {1536, 384}), 0.02, 0.001);
  EXPECT_NEAR(stddev("transformer.h.3.attn.c_proj.weight", {384, 384}), 0.005, 0.0003);
  EXPECT_NEAR(stddev("transformer.h.7.mlp.c_proj.weight", {384, 1536}), 0.005, 0.0003);
  EXPECT_TRUE(at::equal(init_parameter(config, "lm_head.weight", {256, 384}, seed),
                        init_parameter(config, "transformer.wte.weight", {256, 384}, seed)));
  EXPECT_TRUE(at::equal(init_parameter(config, "transformer.h.2.ln_1.weight", {384}, seed),
                        at::ones({384})));
  EXPECT_TRUE(
      at::equal(init_parameter(config, "transformer.ln_f.bias", {384}, seed), at::zeros({384})));
  EXPECT_TRUE(at::equal(init_parameter(config, "transformer.h.2.mlp.c_fc.bias", {1536}, seed),
                        at::zeros({1536})));
}

TEST(GPT2, InitParameterRejectsUnknownNamesAndWrongShapes) {
  GPT2Config config = GPT2Config::tiny();
  auto message = [&](const std::string& name, std::vector<int64_t> shape) {
    try {
      init_parameter(config, name, shape, 0);
    } catch (const c10::Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("transformer.h.2.ln_1.weight", {32}).find("'transformer.h.2.ln_1.weight'"),
            std::string::npos);  // layer 2 of 2
  EXPECT_NE(message("transformer.h.01.ln_1.weight", {32}).find("is not a parameter"),
            std::string::npos);
  EXPECT_NE(message("h.0.ln_1.weight", {32}).find("is not a parameter"), std::string::npos);
  const std::string shard = message("transformer.wte.weight", {128, 32});
  EXPECT_NE(shard.find("[128, 32]"), std::string::npos) << shard;
  EXPECT_NE(shard.find("[256, 32]"), std::string::npos) << shard;
}

TEST(GPT2, DeferredConstructionHandsOutEachBlockOnceInOrder) {
  std::vector<std::string> names;
  std::vector<std::shared_ptr<torch::nn::Module>> units;
  GPT2Config config = GPT2Config::tiny();
  config.n_layer = 4;
  auto on_block = [&](const std::string& name, const std::shared_ptr<torch::nn::Module>& unit) {
    names.push_back(name);
    units.push_back(unit);
    // The block is complete and initialized when handed out.
    for (const auto& item : unit->named_parameters()) {
      EXPECT_TRUE(at::equal(
          item.value(), init_parameter(config, name + "." + item.key(), item.value().sizes(), 17)))
          << name << "." << item.key();
    }
    EXPECT_EQ(unit->named_parameters().size(), 12u);
  };
  GPT2LMHead model(GPT2Options(config).seed(17).on_block_built(on_block));
  EXPECT_EQ(names, (std::vector<std::string>{"transformer.h.0", "transformer.h.1",
                                             "transformer.h.2", "transformer.h.3"}));
  ASSERT_EQ(units.size(), 4u);
  for (size_t i = 0; i < units.size(); ++i) {
    EXPECT_EQ(units[i].get(), model->transformer->blocks[i].ptr().get());
  }
  GPT2LMHead plain(GPT2Options(config).seed(17));
  expect_same_parameters(model, plain);
}

}  // namespace
}  // namespace fsdp::models
