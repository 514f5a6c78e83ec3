// Trainer data tests: the global batch is a pure function of (text, step, sizes, seed), its
// micro-batches tile it in rank order, targets are the inputs shifted by one (fine-tuning
// data's: the labels shifted by one, masks included, and the summed loss leaves them out),
// errors name the offending values, and the built-in corpus is fixed bytes with a known entropy.
#include "support/test_support.h"

#include <ATen/ATen.h>
#include <fsdp/train/token_dataset.h>
#include <fsdp_train/corpus.h>
#include <gtest/gtest.h>
#include <models/common/modules.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <set>
#include <string>
#include <vector>

namespace fsdp::train {
namespace {

std::string row_text(const at::Tensor& row) {
  std::string s;
  for (int64_t i = 0; i < row.size(0); ++i) s.push_back(static_cast<char>(row[i].item<int64_t>()));
  return s;
}

TEST(TokenDataset, GlobalBatchIsDeterministic) {
  TokenDataset data{std::string(default_corpus())};
  auto a = data.global_batch(5, 8, 32, 1);
  auto b = data.global_batch(5, 8, 32, 1);
  EXPECT_EQ(a.first.sizes(), at::IntArrayRef({8, 32}));
  EXPECT_EQ(a.first.scalar_type(), at::kLong);
  EXPECT_TRUE(at::equal(a.first, b.first));
  EXPECT_TRUE(at::equal(a.second, b.second));
  EXPECT_FALSE(at::equal(a.first, data.global_batch(6, 8, 32, 1).first));
  EXPECT_FALSE(at::equal(a.first, data.global_batch(5, 8, 32, 2).first));
  // A bigger batch is not a prefix-extension promise, but the same call from another dataset
  // object over the same text is identical (no hidden state).
  TokenDataset again{std::string(default_corpus())};
  EXPECT_TRUE(at::equal(a.first, again.global_batch(5, 8, 32, 1).first));
}

TEST(TokenDataset, RowsAreWindowsOfTheTextAndTargetsAreShiftedInputs) {
  const std::string text(default_corpus());
  TokenDataset data(text);
  auto [inputs, targets] = data.global_batch(3, 6, 40, 9);
  EXPECT_TRUE(at::equal(inputs.slice(1, 1), targets.slice(1, 0, 39)));
  for (int64_t b = 0; b < 6; ++b) {
    const std::string window = row_text(inputs[b]) + row_text(targets[b].slice(0, 39));
    EXPECT_NE(text.find(window), std::string::npos) << "row " << b;
  }
}

// Token i is id i; the label of every third token is masked, the others are 1000 + i, so a
// target shows which label it came from.
TokenDataset labeled_counting(int64_t n) {
  const at::Tensor tokens = at::arange(n, at::kInt);
  const at::Tensor labels =
      at::where(tokens % 3 == 0, at::full({n}, -100, at::kInt), tokens + 1000).to(at::kInt);
  return TokenDataset(tokens, labels, "counting");
}

TEST(TokenDataset, LabeledTargetsAreTheNextPositionsLabels) {
  const TokenDataset data = labeled_counting(50);
  EXPECT_TRUE(data.labeled());
  auto [inputs, targets] = data.global_batch(4, 6, 10, 3);
  ASSERT_EQ(targets.sizes(), at::IntArrayRef({6, 10}));
  EXPECT_EQ(targets.scalar_type(), at::kLong);
  for (int64_t b = 0; b < 6; ++b) {
    for (int64_t t = 0; t < 10; ++t) {
      const int64_t next = inputs[b][t].item<int64_t>() + 1;  // the next token's position
      const int64_t want = next % 3 == 0 ? -100 : 1000 + next;
      EXPECT_EQ(targets[b][t].item<int64_t>(), want) << "row " << b << " position " << t;
    }
  }
  // The inputs are the windows a plain dataset of the same tokens draws.
  const TokenDataset plain(at::arange(50, at::kInt), "counting");
  EXPECT_TRUE(at::equal(inputs, plain.global_batch(4, 6, 10, 3).first));
  EXPECT_FALSE(plain.labeled());
  EXPECT_EQ(trained_targets(targets), (targets != -100).sum().item<int64_t>());
  EXPECT_EQ(trained_targets(at::tensor({-100, 3, -100, 0}, at::kLong)), 2);
}

TEST(TokenDataset, LabelsMustMatchTheTokens) {
  try {
    TokenDataset(at::arange(5, at::kInt), at::arange(4, at::kInt), "short labels");
    FAIL() << "labels of another length were accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("short labels: labels must be a 1-D int32 CPU tensor as "
                                         "long as the int32 token ids (5)"),
              std::string::npos)
        << e.what();
  }
}

// The summed loss is the cross-entropy of the trained targets only: masked positions add
// nothing to it nor to the gradient, and the mean over trained targets is its quotient.
TEST(MaskedLoss, SummedLossLeavesMaskedTargetsOut) {
  at::manual_seed(3);
  const at::Tensor logits = at::randn({2, 3, 5}, at::kFloat).requires_grad_(true);
  const at::Tensor targets = at::tensor({1, -100, 4, -100, -100, 0}, at::kLong).view({2, 3});
  const at::Tensor summed = models::summed_loss(logits, targets);
  const at::Tensor logp = at::log_softmax(logits.detach().view({6, 5}), 1);
  const double want = -(logp[0][1] + logp[2][4] + logp[5][0]).item<double>();
  EXPECT_NEAR(summed.item<double>(), want, 1e-6 * want);
  summed.backward();
  const at::Tensor grad = logits.grad().view({6, 5});
  for (const int64_t masked : {1, 3, 4}) EXPECT_EQ(grad[masked].abs().sum().item<double>(), 0.0);
  // The mean over trained targets is PyTorch's ignore_index mean.
  const at::Tensor mean = at::cross_entropy_loss(logits.detach().view({6, 5}), targets.view({-1}));
  EXPECT_NEAR(summed.item<double>() / 3, mean.item<double>(), 1e-6);
  // No trained target: 0, not NaN.
  EXPECT_EQ(models::summed_loss(logits.detach(), at::full({2, 3}, -100, at::kLong)).item<double>(),
            0.0);
}

TEST(TokenDataset, EveryWindowIncludingTheLastCanBeDrawn) {
  // 9 bytes, seq_len 6: windows start at 0, 1 or 2.
  TokenDataset data(std::string("abcdefghi"));
  std::set<std::string> seen;
  for (int64_t step = 0; step < 20; ++step) {
    auto [inputs, targets] = data.global_batch(step, 4, 6, 0);
    for (int64_t b = 0; b < 4; ++b) seen.insert(row_text(inputs[b]) + row_text(targets[b]).back());
  }
  EXPECT_EQ(seen, (std::set<std::string>{"abcdefg", "bcdefgh", "cdefghi"}));
}

TEST(TokenDataset, MicroBatchesConcatenateToTheGlobalBatch) {
  TokenDataset data{std::string(default_corpus())};
  auto global = data.global_batch(2, 12, 16, 4);
  for (int64_t world : {1, 2, 3, 4, 6, 12}) {
    std::vector<at::Tensor> inputs, targets;
    for (int64_t rank = 0; rank < world; ++rank) {
      auto [x, y] = micro_batch(global, rank, world);
      EXPECT_EQ(x.size(0), 12 / world);
      inputs.push_back(x);
      targets.push_back(y);
    }
    EXPECT_TRUE(at::equal(at::cat(inputs), global.first)) << "world " << world;
    EXPECT_TRUE(at::equal(at::cat(targets), global.second)) << "world " << world;
  }
  EXPECT_TRUE(at::equal(micro_batch(global.first, 1, 3), global.first.slice(0, 4, 8)));
}

TEST(TokenDataset, MicroBatchRejectsWorldNotDividingBatch) {
  at::Tensor global = at::zeros({6, 4}, at::kLong);
  const std::string msg = test::error_message([&] { micro_batch(global, 0, 4); });
  EXPECT_NE(msg.find("global batch size 6"), std::string::npos) << msg;
  EXPECT_NE(msg.find("world size 4"), std::string::npos) << msg;
  EXPECT_NE(test::error_message([&] { micro_batch(global, 3, 3); }).find("rank 3"),
            std::string::npos);
}

TEST(TokenDataset, ShortTextIsRejectedNamingBothLengths) {
  TokenDataset data(std::string(10, 'x'));
  const std::string msg = test::error_message([&] { data.global_batch(0, 2, 64, 0); });
  EXPECT_NE(msg.find("has 10 bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("at least 65"), std::string::npos) << msg;
  // Exactly seq_len + 1 bytes is enough.
  EXPECT_NO_THROW(data.global_batch(0, 2, 9, 0));
}

TEST(TokenDataset, FromFileReadsBytesAndNamesAMissingPath) {
  char path[] = "/tmp/fsdp_test_data_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  {
    std::ofstream out(path, std::ios::binary);
    out << "caf\xc3\xa9 au lait";  // UTF-8: bytes, not characters
  }
  TokenDataset data = TokenDataset::from_file(path);
  EXPECT_EQ(data.size(), 13);
  EXPECT_EQ(data.tokens()[4].item<uint8_t>(), 0xa9);
  std::remove(path);

  const std::string missing = "/nonexistent/fsdp/corpus.txt";
  const std::string msg = test::error_message([&] { TokenDataset::from_file(missing); });
  EXPECT_NE(msg.find(missing), std::string::npos) << msg;
  EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << msg;
  const std::string dir = test::error_message([] { TokenDataset::from_file("/tmp"); });
  EXPECT_NE(dir.find("'/tmp'"), std::string::npos) << dir;
}

TEST(Corpus, UnigramEntropyOfKnownStrings) {
  EXPECT_NEAR(unigram_entropy_nats("aabb"), std::log(2.0), 1e-12);
  EXPECT_NEAR(unigram_entropy_nats("abcd"), std::log(4.0), 1e-12);
  EXPECT_NEAR(unigram_entropy_nats("aaab"), -(0.75 * std::log(0.75) + 0.25 * std::log(0.25)),
              1e-12);
  EXPECT_EQ(unigram_entropy_nats("aaaa"), 0.0);
  EXPECT_EQ(unigram_entropy_nats(""), 0.0);
}

TEST(Corpus, DefaultCorpusIsFixedEnglishText) {
  std::string_view corpus = default_corpus();
  EXPECT_EQ(corpus.data(), default_corpus().data());  // built once
  EXPECT_GE(corpus.size(), 32u * 1024);
  EXPECT_LT(corpus.size(), 40u * 1024);
  for (char c : corpus) ASSERT_TRUE(c == '\n' || (c >= 32 && c < 127)) << int(c);
  EXPECT_EQ(corpus.substr(0, 18), "Once upon a time, ");
  const double entropy = unigram_entropy_nats(corpus);
  EXPECT_GT(entropy, 2.5);
  EXPECT_LT(entropy, 3.2);
  // Golden FNV-1a of the bytes: the corpus must be the same on every platform, or loss curves
  // from different machines would not be comparable.
  uint64_t hash = 14695981039346656037ULL;
  for (unsigned char c : corpus) {
    hash ^= c;
    hash *= 1099511628211ULL;
  }
  EXPECT_EQ(hash, 14941314237923401059ULL) << "size " << corpus.size() << " entropy " << entropy;
}

}  // namespace
}  // namespace fsdp::train
