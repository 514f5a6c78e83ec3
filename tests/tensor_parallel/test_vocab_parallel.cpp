// The vocabulary split against one process: the embedding table's rows (RowwiseParallel on a
// torch::nn::Embedding) look up every token once, with the gradient of each row on the rank that
// holds it; a head tied to that table (ColwiseParallel on a TiedLinear) keeps the one slice; the
// cross-entropy of logits split over the vocabulary equals at::cross_entropy_loss's per row,
// ignored targets included, and so does its gradient, in float32 and from bf16 logits. Styles
// that do not fit a module are refused by name.
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

// An embedding table [8, 3] and a head tied to it, as GPT-2's wte and lm_head.
struct TiedPair : torch::nn::Module {
  TiedPair() {
    table = register_module("table", torch::nn::Embedding(8, 3));
    head = register_module("head", models::TiedLinear(table->weight));
    at::NoGradGuard no_grad;
    table->weight.copy_(seeded_uniform({8, 3}, 3, 1.0));
  }
  at::Tensor forward(const at::Tensor& ids) { return head->forward(embedding(table, ids)); }
  torch::nn::Embedding table{nullptr};
  models::TiedLinear head{nullptr};
};

TEST(VocabParallel, TiedEmbeddingAndHeadMatchOneProcess) {
  const at::Tensor ids = at::tensor({0, 7, 3, 4, 4, 1}, at::kLong).reshape({2, 3});
  TiedPair reference;
  const at::Tensor logits_ref = reference.forward(ids);
  (logits_ref * logits_ref).sum().backward();
  run_ranks_in_threads(2, [&](std::shared_ptr<ProcessGroup> group) {
    const int r = group->rank();
    TiedPair pair;
    parallelize_module(pair, DeviceMesh(group, "tp"),
                       {{"table", RowwiseParallel()}, {"head", ColwiseParallel()}});
    // One slice of the one tensor: rows 4r.. of the table.
    ASSERT_EQ(pair.table->weight.sizes(), (std::vector<int64_t>{4, 3}));
    EXPECT_TRUE(pair.head->weight.is_same(pair.table->weight));
    EXPECT_TRUE(splits_vocabulary(*pair.head));
    const at::Tensor logits = pair.forward(ids);  // this rank's 4 columns of the vocabulary
    (logits * logits).sum().backward();
    expect_near(logits, logits_ref.narrow(2, 4 * r, 4), 1e-6, "logits");
    expect_near(pair.table->weight.grad(), reference.table->weight.grad().narrow(0, 4 * r, 4), 1e-6,
                "the table's gradient (lookups and head)");
  });
}

// An output projection to a vocabulary of 8, held as a model holds its head.
struct Head : torch::nn::Module {
  Head() { proj = register_module("proj", torch::nn::Linear(torch::nn::LinearOptions(2, 8))); }
  torch::nn::Linear proj{nullptr};
};

// Logits [6, 8] against targets in both halves of the vocabulary, one ignored.
void expect_cross_entropy_matches(at::ScalarType dtype, double tol) {
  const at::Tensor logits = (seeded_uniform({6, 8}, 5, 4.0)).to(dtype);
  const at::Tensor targets = at::tensor({0, 7, 3, -100, 4, 5}, at::kLong);
  const at::Tensor weights = seeded_uniform({6}, 9, 1.0);  // a gradient for every row
  const at::Tensor ref_in = logits.detach().to(at::kFloat).requires_grad_(true);
  const at::Tensor ref = at::cross_entropy_loss(ref_in, targets, {}, at::Reduction::None, -100);
  (ref * weights).sum().backward();
  run_ranks_in_threads(2, [&](std::shared_ptr<ProcessGroup> group) {
    const int r = group->rank();
    Head holder;
    parallelize_module(holder, DeviceMesh(group, "tp"), {{"proj", ColwiseParallel()}});
    const at::Tensor mine = logits.narrow(1, 4 * r, 4).detach().clone().requires_grad_(true);
    const at::Tensor losses = vocab_parallel_cross_entropy(*holder.proj, mine, targets);
    (losses * weights).sum().backward();
    EXPECT_EQ(losses.scalar_type(), at::kFloat);
    expect_near(losses, ref, tol, "per-row losses");
    expect_near(mine.grad().to(at::kFloat), ref_in.grad().narrow(1, 4 * r, 4), tol,
                "the logits' gradient");
  });
}

TEST(VocabParallel, CrossEntropyMatchesOneProcess) {
  expect_cross_entropy_matches(at::kFloat, 1e-6);
  // Upcast, as at's callers do; the logits' gradient comes back in bf16 (8 bits).
  expect_cross_entropy_matches(at::kBFloat16, 1e-2);
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
