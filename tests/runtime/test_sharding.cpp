// Dim-0 shard layout arithmetic.
#include <fsdp/runtime/sharding.h>

#include <gtest/gtest.h>

namespace fsdp {
namespace {

TEST(ShardLayout, EvenSplit) {
  auto l = shard_layout({8, 3}, 1, 4);
  EXPECT_EQ(l.chunk_rows, 2);
  EXPECT_EQ(l.local_offset, 2);
  EXPECT_EQ(l.local_rows, 2);
  EXPECT_EQ(l.inner, 3);
  EXPECT_EQ(l.padded_numel(), 6);
}

TEST(ShardLayout, UnevenSplitPadsTheLastRanks) {
  // 13 rows over 4 ranks: chunks of 4 rows, the last rank holds 1 real row and 3 padding rows.
  const int64_t expected_rows[] = {4, 4, 4, 1};
  int64_t covered = 0;
  for (int r = 0; r < 4; ++r) {
    auto l = shard_layout({13, 7}, r, 4);
    EXPECT_EQ(l.chunk_rows, 4);
    EXPECT_EQ(l.local_rows, expected_rows[r]) << "rank " << r;
    EXPECT_EQ(l.local_offset, covered) << "rank " << r;
    covered += l.local_rows;
  }
  EXPECT_EQ(covered, 13);
}

TEST(ShardLayout, FewerRowsThanRanksLeavesRanksEmpty) {
  auto first = shard_layout({1, 7}, 0, 4);
  auto last = shard_layout({1, 7}, 3, 4);
  EXPECT_EQ(first.chunk_rows, 1);
  EXPECT_EQ(first.local_rows, 1);
  EXPECT_EQ(last.local_rows, 0);
  EXPECT_EQ(last.local_offset, 1);
  EXPECT_EQ(last.padded_shape({1, 7}), (std::vector<int64_t>{1, 7}));
}

TEST(ShardLayout, ScalarIsAOneElementVector) {
  auto l0 = shard_layout({}, 0, 3);
  auto l2 = shard_layout({}, 2, 3);
  EXPECT_EQ(l0.dim_size, 1);
  EXPECT_EQ(l0.local_rows, 1);
  EXPECT_EQ(l2.local_rows, 0);
  EXPECT_EQ(l0.padded_shape({}), (std::vector<int64_t>{1}));
}

TEST(ShardLayout, OneDimensional) {
  auto l = shard_layout({7}, 2, 3);
  EXPECT_EQ(l.chunk_rows, 3);
  EXPECT_EQ(l.inner, 1);
  EXPECT_EQ(l.local_offset, 6);
  EXPECT_EQ(l.local_rows, 1);
}

TEST(ShardLayout, RejectsBadRank) {
  EXPECT_THROW(shard_layout({4}, 4, 4), c10::Error);
  EXPECT_THROW(shard_layout({4}, 0, 0), c10::Error);
}

}  // namespace
}  // namespace fsdp
