// Llama (llama-tiny: grouped-query attention, rope scaling) trained with fully_shard over W
// thread-ranks, each decoder layer a unit sharded as it is built and the root last, against the
// single-process reference: 8 AdamW steps with weight decay and clipping; W = 1 bit-identical,
// W = 2, 3, 4 within 1e-5 (losses and grad norms relative, parameters absolute); tied
// embeddings, activation checkpointing and the head as a unit too.
#include "support/harness.h"
#include "support/test_support.h"

#include <models/llama/llama.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <iostream>

namespace fsdp::test {
namespace {

using models::LlamaConfig;
using models::LlamaForCausalLM;
using models::LlamaForCausalLMImpl;
using models::LlamaOptions;

struct LlamaCaseOptions {
  LlamaConfig config = LlamaConfig::tiny();
  bool activation_checkpoint = false;
  // The head a unit of its own, gathered from its forward to its backward (--head-unit).
  bool head_unit = false;
};

TrainCase llama_case(const LlamaCaseOptions& opt = {}) {
  TrainCase c;
  c.loss = [](const std::shared_ptr<torch::nn::Module>& m, const at::Tensor& x,
              const at::Tensor& y) {
    LlamaForCausalLM model(std::static_pointer_cast<LlamaForCausalLMImpl>(m));
    return models::loss(fsdp::forward(model, x), y);
  };
  c.batch = [](int64_t step) { return text_batch(step, 12, 16, 7); };
  c.steps = 8;
  c.lr = 1e-3;
  c.weight_decay = 0.1;
  c.max_grad_norm = 1.0;
  c.make_model = [opt](const DeviceMesh* mesh) {
    LlamaOptions o(opt.config);
    o.seed(42).activation_checkpoint(opt.activation_checkpoint);
    if (mesh != nullptr) {
      const DeviceMesh m = *mesh;
      o.on_layer_built([m](const std::string&, const std::shared_ptr<torch::nn::Module>& layer) {
        fully_shard(layer, m);
      });
    }
    return LlamaForCausalLM(o).ptr();
  };
  c.shard = [opt](const std::shared_ptr<torch::nn::Module>& m, const DeviceMesh& mesh) {
    if (opt.head_unit) {
      fully_shard(std::static_pointer_cast<LlamaForCausalLMImpl>(m)->lm_head, mesh,
                  FullyShardOptions().reshard_after_forward(false));
    }
    fully_shard(m, mesh);
  };
  return c;
}

// The largest differences from the reference, printed for the record.
void report(const std::string& what, const TrainRecord& reference,
            const std::vector<TrainRecord>& ranks) {
  double loss = 0, norm = 0, param = 0;
  for (const auto& r : ranks) {
    for (size_t s = 0; s < reference.losses.size() && s < r.losses.size(); ++s) {
      loss = std::max(loss, std::abs(r.losses[s] - reference.losses[s]) / reference.losses[s]);
      norm = std::max(
          norm, std::abs(r.grad_norms[s] - reference.grad_norms[s]) / reference.grad_norms[s]);
    }
    for (const auto& [name, shard] : r.params) {
      const ShardMetadata& m = r.metadata.at(name);
      if (m.local_rows == 0) continue;
      const at::Tensor full =
          reference.params.at(name).reshape({m.global_shape.empty() ? 1 : m.global_shape[0], -1});
      const at::Tensor mine = shard.reshape({m.padded_rows, -1}).narrow(0, 0, m.local_rows);
      param = std::max(
          param, (mine - full.narrow(0, m.local_offset, m.local_rows)).abs().max().item<double>());
    }
  }
  std::cout << what << ": max relative loss difference " << loss << ", grad norm " << norm
            << ", max |parameter difference| " << param << "\n";
}

TEST(LlamaEquivalence, OneRankIsBitIdenticalToNoFsdp) {
  const TrainCase c = llama_case();
  expect_bit_identical(train_reference(c), train_sharded(c, 1)[0]);
}

class LlamaEquivalenceW : public ::testing::TestWithParam<int> {};

TEST_P(LlamaEquivalenceW, MatchesSingleProcess) {
  const TrainCase c = llama_case();
  const TrainRecord reference = train_reference(c);
  // The model learns: a test of equal runs that train nothing would prove little.
  EXPECT_LT(reference.losses.back(), reference.losses.front() - 0.1);
  const auto ranks = train_sharded(c, GetParam());
  report("llama-tiny W=" + std::to_string(GetParam()), reference, ranks);
  expect_equivalent(reference, ranks, 1e-5, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(World, LlamaEquivalenceW, ::testing::Values(2, 3, 4));

TEST(LlamaEquivalence, TiedEmbeddingsMatchSingleProcess) {
  LlamaCaseOptions opt;
  opt.config.tie_word_embeddings = true;
  const TrainCase c = llama_case(opt);
  const TrainRecord reference = train_reference(c);
  const auto ranks = train_sharded(c, 2);
  report("llama-tiny tied W=2", reference, ranks);
  expect_equivalent(reference, ranks, 1e-5, 1e-5);
}

// An untied head is a unit of its own; a tied one takes the table with it, which the lookup then
// reads from the head's shards.
class LlamaHeadUnit : public ::testing::TestWithParam<bool> {};

TEST_P(LlamaHeadUnit, MatchesSingleProcess) {
  LlamaCaseOptions opt;
  opt.config.tie_word_embeddings = GetParam();
  opt.head_unit = true;
  const TrainCase c = llama_case(opt);
  const TrainRecord reference = train_reference(c);
  const auto ranks = train_sharded(c, 3);
  report(std::string("llama-tiny head unit, ") + (GetParam() ? "tied" : "untied") + ", W=3",
         reference, ranks);
  expect_equivalent(reference, ranks, 1e-5, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Tied, LlamaHeadUnit, ::testing::Bool());

TEST(LlamaEquivalence, ActivationCheckpointingMatchesThePlainReference) {
  LlamaCaseOptions opt;
  opt.activation_checkpoint = true;
  const TrainRecord reference = train_reference(llama_case());
  const auto ranks = train_sharded(llama_case(opt), 2);
  report("llama-tiny activation checkpointing W=2", reference, ranks);
  expect_equivalent(reference, ranks, 1e-5, 1e-5);
}

}  // namespace
}  // namespace fsdp::test
