// Trainer data tests: the global batch is a pure function of (text, step, sizes, seed), its
// micro-batches tile it in rank order, targets are the inputs shifted by one, errors name the
// offending values, and the built-in corpus is fixed bytes with a known entropy.
#include "support/test_support.h"

#include <ATen/ATen.h>
#include <fsdp_train/corpus.h>
#include <fsdp_train/data.h>
#include <gtest/gtest.h>
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
