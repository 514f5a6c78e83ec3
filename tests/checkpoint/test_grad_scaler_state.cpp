// fp16's gradient scaler state in sharded checkpoints: stored once in metadata.json
// ("grad_scaler"), parsed back exactly, validated as hostile input, and returned by load_sharded
// at another world size (the state is the same on every rank, so any rank count reads it).
#include "support/test_support.h"

#include <fsdp/checkpoint/checkpoint.h>
#include <fsdp/checkpoint/format.h>
#include <fsdp/comm/rendezvous.h>
#include <fsdp/fully_shard.h>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include <string>

namespace fsdp::checkpoint {
namespace {

using ::testing::HasSubstr;

CheckpointIndex index_with_scaler() {
  CheckpointIndex index;
  index.world_size = 1;
  index.files = {{rank_file_name(0, 1), 8, 1}};
  // A scale that is not a power of two (growth 3, backoff 0.3): it must come back exactly.
  index.grad_scaler = GradScalerRecord{float(65536.0 * 0.3 * 0.3), 4, 3.0, 0.3, 7};
  return index;
}

TEST(GradScalerCheckpoint, TheIndexRecordRoundTripsExactly) {
  const CheckpointIndex index = index_with_scaler();
  const CheckpointIndex back = parse_checkpoint_index(serialize_checkpoint_index(index));
  ASSERT_TRUE(back.grad_scaler.has_value());
  EXPECT_EQ(back.grad_scaler->scale, index.grad_scaler->scale);
  EXPECT_EQ(back.grad_scaler->growth_tracker, 4);
  EXPECT_EQ(back.grad_scaler->growth_factor, 3.0);
  EXPECT_EQ(back.grad_scaler->backoff_factor, 0.3);
  EXPECT_EQ(back.grad_scaler->growth_interval, 7);
  CheckpointIndex without = index;
  without.grad_scaler.reset();
  EXPECT_FALSE(parse_checkpoint_index(serialize_checkpoint_index(without)).grad_scaler);
}

TEST(GradScalerCheckpoint, AHostileRecordIsRejectedNamingTheField) {
  const std::string good = serialize_checkpoint_index(index_with_scaler());
  const auto error = [&](const std::string& from, const std::string& to) {
    std::string s = good;
    const auto pos = s.find(from);
    EXPECT_NE(pos, std::string::npos) << from;
    s.replace(pos, from.size(), to);
    try {
      parse_checkpoint_index(s, /*verify_checksum=*/false);
    } catch (const FormatError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_THAT(error("\"growth_tracker\": 4", "\"growth_tracker\": 7"),
              HasSubstr("growth_tracker 7 must be below growth_interval 7"));
  EXPECT_THAT(error("\"growth_tracker\": 4", "\"growth_tracker\": -1"),
              HasSubstr("grad_scaler growth_tracker must be a non-negative integer"));
  EXPECT_THAT(error("\"growth_factor\": 3.0", "\"growth_factor\": 1.0"),
              HasSubstr("grad_scaler growth_factor 1 must be > 1"));
  EXPECT_THAT(error("\"backoff_factor\": 0.3", "\"backoff_factor\": \"half\""),
              HasSubstr("grad_scaler backoff_factor must be a number"));
  EXPECT_THAT(error("\"growth_interval\": 7", "\"growth_interval\": 7, \"extra\": 1"),
              HasSubstr("unexpected field"));
  EXPECT_THAT(error("\"growth_interval\": 7", "\"growth_interval\": 0"),
              HasSubstr("must be below growth_interval 0"));
  EXPECT_THAT(error("\"scale\": ", "\"scale\": -"), HasSubstr("is not a positive float32 value"));
  CheckpointIndex huge = index_with_scaler();
  huge.grad_scaler->scale = 1e39;  // past float32's range
  EXPECT_THAT(
      test::error_message([&] { parse_checkpoint_index(serialize_checkpoint_index(huge)); }),
      HasSubstr("grad_scaler scale 1e+39 is not a positive float32 value"));
}

TEST(GradScalerCheckpoint, SavedAtTwoRanksLoadsAtOne) {
  const std::string root = test::temp_path("grad_scaler_ckpt");
  GradScalerState state;
  state.scale = 8192;
  state.growth_tracker = 5;
  state.growth_interval = 11;
  run_ranks_in_threads(
      2,
      [&](std::shared_ptr<ProcessGroup> group) {
        DeviceMesh mesh(group);
        torch::nn::Linear linear(4, 3);
        fully_shard(linear, mesh);
        save_sharded(root, *linear, nullptr, group.get(), SaveOptions().step(3).grad_scaler(state));
      },
      test::test_options());
  torch::nn::Linear plain(4, 3);
  const LoadResult loaded = load_sharded(root, *plain, nullptr, nullptr);
  ASSERT_TRUE(loaded.grad_scaler.has_value());
  EXPECT_EQ(loaded.grad_scaler->scale, 8192);
  EXPECT_EQ(loaded.grad_scaler->growth_tracker, 5);
  EXPECT_EQ(loaded.grad_scaler->growth_interval, 11);
  EXPECT_EQ(loaded.grad_scaler->growth_factor, 2.0);
  ShardedGradScaler scaler(std::nullopt);
  scaler.load_state(*loaded.grad_scaler);
  EXPECT_EQ(scaler.get_scale(), 8192);
  EXPECT_EQ(scaler.growth_tracker(), 5);

  // A checkpoint saved without one has none; a state no scaler would load is not saved.
  save_sharded(root, *plain, nullptr, nullptr, SaveOptions().step(4));
  EXPECT_FALSE(load_sharded(root, *plain, nullptr, nullptr).grad_scaler.has_value());
  state.growth_tracker = 11;
  EXPECT_THAT(test::error_message([&] {
                save_sharded(root, *plain, nullptr, nullptr,
                             SaveOptions().step(5).grad_scaler(state));
              }),
              HasSubstr("growth_tracker must be in [0, growth_interval 11), got 11"));
}

}  // namespace
}  // namespace fsdp::checkpoint
