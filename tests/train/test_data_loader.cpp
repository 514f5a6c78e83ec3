// The loader (fsdp/train/data_loader.h): a step's batch is a pure function of (seed, step) and
// the rank's rows are a slice of it, so loaders built apart, on any rank, in any order, agree;
// its saved position resumes exactly, and a position saved with other settings is refused
// naming them.
#include <fsdp/train/data_loader.h>

#include "support/test_support.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace fsdp::train {
namespace {

// 1,000 tokens of a fixed pseudo-random sequence (int32 ids below 97).
TokenDataset numbers() {
  return TokenDataset((at::arange(1000, at::kInt) * 7919 % 97).to(at::kInt), "numbers");
}

DataLoaderOptions options(int64_t rank = 0, int64_t world = 1, uint64_t seed = 5) {
  return DataLoaderOptions().global_batch(8).seq_len(12).seed(seed).rank(rank).world_size(world);
}

TEST(DataLoader, BatchesArePureFunctionsOfSeedAndStep) {
  const TokenDataset data = numbers();
  DataLoader walked(data, options());
  std::vector<Batch> first;
  for (int i = 0; i < 4; ++i) first.push_back(walked.next());
  // Built afresh, visited backwards: the same batches.
  const DataLoader fresh(data, options());
  for (int64_t step = 3; step >= 0; --step) {
    const Batch b = fresh.batch_at(step);
    EXPECT_EQ(b.step, step);
    EXPECT_TRUE(at::equal(b.inputs, first[step].inputs)) << "step " << step;
    EXPECT_TRUE(at::equal(b.targets, first[step].targets)) << "step " << step;
  }
  // Steps differ from each other, and another seed gives other batches.
  EXPECT_FALSE(at::equal(first[0].inputs, first[1].inputs));
  const DataLoader other_seed(data, options(0, 1, 6));
  EXPECT_FALSE(at::equal(other_seed.batch_at(0).inputs, first[0].inputs));
  // Targets are the inputs shifted by one token.
  EXPECT_TRUE(at::equal(first[2].inputs.slice(1, 1), first[2].targets.slice(1, 0, 11)));
  EXPECT_EQ(first[0].inputs.sizes(), (std::vector<int64_t>{8, 12}));
  EXPECT_EQ(first[0].inputs.scalar_type(), at::kLong);
}

TEST(DataLoader, RanksRowsConcatenateToTheSingleProcessBatch) {
  const TokenDataset data = numbers();
  const DataLoader single(data, options());
  for (const int64_t world : {2, 4}) {
    for (int64_t step = 0; step < 3; ++step) {
      std::vector<at::Tensor> inputs, targets;
      for (int64_t rank = 0; rank < world; ++rank) {
        const Batch b = DataLoader(data, options(rank, world)).batch_at(step);
        EXPECT_EQ(b.inputs.size(0), 8 / world);
        EXPECT_TRUE(at::equal(b.global_inputs, single.batch_at(step).inputs));
        inputs.push_back(b.inputs);
        targets.push_back(b.targets);
      }
      EXPECT_TRUE(at::equal(at::cat(inputs), single.batch_at(step).inputs))
          << "world " << world << ", step " << step;
      EXPECT_TRUE(at::equal(at::cat(targets), single.batch_at(step).targets));
    }
  }
}

TEST(DataLoader, SavedPositionResumesExactly) {
  const TokenDataset data = numbers();
  DataLoader straight(data, options(1, 2));
  for (int i = 0; i < 5; ++i) straight.next();
  const std::string state = straight.state_json();
  const auto saved = nlohmann::json::parse(state);
  EXPECT_EQ(saved["next_step"], 5);
  EXPECT_EQ(saved["source"], "numbers");
  EXPECT_EQ(saved["tokens"], 1000);

  // A resumed loader on another world size (same global batch) continues with the same
  // global batches.
  DataLoader resumed(data, options(0, 4));
  resumed.load_state_json(state);
  EXPECT_EQ(resumed.step(), 5);
  for (int i = 0; i < 3; ++i) {
    const Batch want = straight.next();
    const Batch got = resumed.next();
    EXPECT_EQ(got.step, want.step);
    EXPECT_TRUE(at::equal(got.global_inputs, want.global_inputs)) << "step " << want.step;
    EXPECT_TRUE(at::equal(got.global_targets, want.global_targets));
  }
}

TEST(DataLoader, PositionOfOtherBatchesIsRefusedNamingTheValues) {
  const TokenDataset data = numbers();
  DataLoader saver(data, options());
  saver.seek(3);
  const std::string state = saver.state_json();
  DataLoader other_seed(data, options(0, 1, 9));
  const std::string msg = test::error_message([&] { other_seed.load_state_json(state); });
  EXPECT_NE(msg.find("seed 5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("has 9"), std::string::npos) << msg;
  EXPECT_EQ(other_seed.step(), 0);
  DataLoader loader(data, options());
  EXPECT_NE(test::error_message([&] { loader.load_state_json("[1, 2]"); }).find("next_step"),
            std::string::npos);
}

TEST(DataLoader, BadOptionsAreRefusedNamingTheValues) {
  const TokenDataset data = numbers();
  std::string msg = test::error_message([&] { DataLoader(data, options(2, 2)); });
  EXPECT_NE(msg.find("rank 2 is outside world size 2"), std::string::npos) << msg;
  msg = test::error_message([&] { DataLoader(data, options(0, 3)); });
  EXPECT_NE(msg.find("global batch size 8"), std::string::npos) << msg;
  EXPECT_NE(msg.find("world size 3"), std::string::npos) << msg;
  msg = test::error_message([&] { DataLoader(data, options().seq_len(1000)); });
  EXPECT_NE(msg.find("1001"), std::string::npos) << msg;
  DataLoader loader(data, options());
  EXPECT_NE(test::error_message([&] { loader.seek(-1); }).find("-1"), std::string::npos);
}

}  // namespace
}  // namespace fsdp::train
