// The vocabulary split against one process: the embedding table's rows (RowwiseParallel on a
// torch::nn::Embedding) look up every token once, with the gradient of each row on the rank that
// holds it; a head tied to that table (ColwiseParallel on a TiedLinear) keeps the one slice; the
// cross-entropy of logits split over the vocabulary equals at::cross_entropy_loss's per row,
// ignored targets included, and so does its gradient, in float32 and from bf16 logits. A
// vocabulary that does not divide by the ranks splits as torch.chunk does ([Note: an uneven
// vocabulary]): 7 over 2 (4 and 3), 8 over 3 (3, 3 and 2). Styles that do not fit a module, and a
// vocabulary too small for every rank to hold a row, are refused by name.
#include "support/harness.h"
#include "support/test_support.h"

#include <fsdp/tensor_parallel.h>
#include <models/common/modules.h>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/embedding.h>

#include <string>
#include <vector>

namespace fsdp::test {
namespace {

using ::testing::HasSubstr;

// got within tol of want, relative to want's largest element.
void expect_near(const at::Tensor& got, const at::Tensor& want, double tol,
                 const std::string& what) {
  const double diff = (got - want).abs().max().item<double>();
  EXPECT_LE(diff, tol * want.abs().max().item<double>()) << what << ": max difference " << diff;
}

// An embedding table [vocab, 3] and a head tied to it, as GPT-2's wte and lm_head.
struct TiedPair : torch::nn::Module {
  explicit TiedPair(int64_t vocab = 8) {
    table = register_module("table", torch::nn::Embedding(vocab, 3));
    head = register_module("head", models::TiedLinear(table->weight));
    at::NoGradGuard no_grad;
    table->weight.copy_(seeded_uniform({vocab, 3}, 3, 1.0));
  }
  at::Tensor forward(const at::Tensor& ids) { return head->forward(embedding(table, ids)); }
  torch::nn::Embedding table{nullptr};
  models::TiedLinear head{nullptr};
};

// (vocabulary, ranks): even, and two that do not divide.
const std::vector<std::pair<int64_t, int>> kSplits = {{8, 2}, {7, 2}, {8, 3}};

TEST(VocabParallel, TiedEmbeddingAndHeadMatchOneProcess) {
  for (const auto& [vocab, world] : kSplits) {
    SCOPED_TRACE(std::to_string(vocab) + " over " + std::to_string(world));
    const at::Tensor ids =
        at::tensor(std::vector<int64_t>{0, vocab - 1, 3, 4, 4, 1}, at::kLong).reshape({2, 3});
    TiedPair reference(vocab);
    const at::Tensor logits_ref = reference.forward(ids);
    (logits_ref * logits_ref).sum().backward();
    run_ranks_in_threads(world, [&](std::shared_ptr<ProcessGroup> group) {
      const TensorParallelRange mine = tensor_parallel_range(vocab, world, group->rank());
      TiedPair pair(vocab);
      parallelize_module(pair, DeviceMesh(group, "tp"),
                         {{"table", RowwiseParallel()}, {"head", ColwiseParallel()}});
      // One slice of the one tensor: rows ceil(V / W) r.. of the table.
      ASSERT_EQ(pair.table->weight.sizes(), (std::vector<int64_t>{mine.length, 3}));
      EXPECT_TRUE(pair.head->weight.is_same(pair.table->weight));
      EXPECT_TRUE(splits_vocabulary(*pair.head));
      const at::Tensor logits = pair.forward(ids);  // this rank's columns of the vocabulary
      (logits * logits).sum().backward();
      expect_near(logits, logits_ref.narrow(2, mine.begin, mine.length), 1e-6, "logits");
      expect_near(pair.table->weight.grad(),
                  reference.table->weight.grad().narrow(0, mine.begin, mine.length), 1e-6,
                  "the table's gradient (lookups and head)");
    });
  }
}

// An output projection to a vocabulary, held as a model holds its head.
struct Head : torch::nn::Module {
  explicit Head(int64_t vocab = 8) {
    proj = register_module("proj", torch::nn::Linear(torch::nn::LinearOptions(2, vocab)));
  }
  torch::nn::Linear proj{nullptr};
};

// Logits [6, vocab] against targets in every rank's part of the vocabulary, one ignored.
void expect_cross_entropy_matches(at::ScalarType dtype, double tol, int64_t vocab, int world) {
  const at::Tensor logits = (seeded_uniform({6, vocab}, 5, 4.0)).to(dtype);
  const at::Tensor targets =
      at::tensor(std::vector<int64_t>{0, vocab - 1, 3, -100, 4, 5}, at::kLong);
  const at::Tensor weights = seeded_uniform({6}, 9, 1.0);  // a gradient for every row
  const at::Tensor ref_in = logits.detach().to(at::kFloat).requires_grad_(true);
  const at::Tensor ref = at::cross_entropy_loss(ref_in, targets, {}, at::Reduction::None, -100);
  (ref * weights).sum().backward();
  run_ranks_in_threads(world, [&](std::shared_ptr<ProcessGroup> group) {
    const TensorParallelRange part = tensor_parallel_range(vocab, world, group->rank());
    Head holder(vocab);
    parallelize_module(holder, DeviceMesh(group, "tp"), {{"proj", ColwiseParallel()}});
    const at::Tensor mine =
        logits.narrow(1, part.begin, part.length).detach().clone().requires_grad_(true);
    const at::Tensor losses = vocab_parallel_cross_entropy(*holder.proj, mine, targets);
    (losses * weights).sum().backward();
    EXPECT_EQ(losses.scalar_type(), at::kFloat);
    expect_near(losses, ref, tol, "per-row losses");
    expect_near(mine.grad().to(at::kFloat), ref_in.grad().narrow(1, part.begin, part.length), tol,
                "the logits' gradient");
  });
}

TEST(VocabParallel, CrossEntropyMatchesOneProcess) {
  for (const auto& [vocab, world] : kSplits) {
    SCOPED_TRACE(std::to_string(vocab) + " over " + std::to_string(world));
    expect_cross_entropy_matches(at::kFloat, 1e-6, vocab, world);
    // Upcast, as at's callers do; the logits' gradient comes back in bf16 (8 bits).
    expect_cross_entropy_matches(at::kBFloat16, 1e-2, vocab, world);
  }
}

TEST(VocabParallel, TheRangesAreTorchChunks) {
  // torch.chunk(arange(50257), 2): 25129 and 25128; arange(10) in 4: 3, 3, 3, 1.
  EXPECT_EQ(tensor_parallel_range(50257, 2, 0).length, 25129);
  EXPECT_EQ(tensor_parallel_range(50257, 2, 1).begin, 25129);
  EXPECT_EQ(tensor_parallel_range(50257, 2, 1).length, 25128);
  EXPECT_EQ(tensor_parallel_range(10, 4, 3).begin, 9);
  EXPECT_EQ(tensor_parallel_range(10, 4, 3).length, 1);
  EXPECT_EQ(tensor_parallel_range(8, 4, 2).begin, 4);
}

// --- errors ---

TEST(VocabParallelErrors, StylesThatDoNotFitAreNamed) {
  run_ranks_in_threads(2, [](std::shared_ptr<ProcessGroup> group) {
    const DeviceMesh tp(group, "tp");
    TiedPair pair;
    EXPECT_THAT(
        [&] {
          parallelize_module(pair, tp, {{"table", ColwiseParallel()}});
        },
        ::testing::ThrowsMessage<c10::Error>(
            HasSubstr("layer 'table' is an Embedding: RowwiseParallel splits its "
                      "vocabulary, ColwiseParallel does not apply")));
    TiedPair rows_then_columns;
    EXPECT_THAT(
        [&] {
          parallelize_module(rows_then_columns, tp,
                             {{"table", RowwiseParallel()}, {"head", RowwiseParallel()}});
        },
        ::testing::ThrowsMessage<c10::Error>(
            HasSubstr("the weight of layer 'head' is shared with a layer split along dimension "
                      "0 and cannot also be split along dimension 1")));
    TiedPair tiny(1);  // one row cannot split over two ranks
    EXPECT_THAT(
        [&] {
          parallelize_module(tiny, tp, {{"table", RowwiseParallel()}});
        },
        ::testing::ThrowsMessage<c10::Error>(
            HasSubstr("RowwiseParallel splits layer 'table' along its vocabulary, 1, which do not "
                      "divide by the tensor-parallel size 2")));
    Head whole;  // not parallelized
    EXPECT_THAT(
        [&] {
          vocab_parallel_cross_entropy(*whole.proj, at::ones({3, 8}), at::zeros({3}, at::kLong));
        },
        ::testing::ThrowsMessage<c10::Error>(
            HasSubstr("does not split its logits over the vocabulary (no ColwiseParallel style)")));
  });
}

}  // namespace
}  // namespace fsdp::test
