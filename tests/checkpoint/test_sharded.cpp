// Sharded checkpoints through the trainer's own loop (fsdp::train::train, ranks as threads):
// resuming must reproduce an uninterrupted run bit for bit at the same world size, and within
// float rounding of the single-process reference at another world size or strategy. Then the
// library directly: loading fills every rank's rows and zeroes padding, and every broken
// checkpoint ends in an error that names the problem, on every rank, without a hang.
#include <fsdp/checkpoint/checkpoint.h>
#include <fsdp/checkpoint/format.h>
#include <fsdp/checkpoint/safetensors.h>
#include <fsdp/comm/rendezvous.h>
#include <fsdp/device_mesh.h>
#include <fsdp/fully_shard.h>
#include <fsdp_train/trainer.h>
#include <models/gpt2/gpt2.h>

#include "support/checkpoint_util.h"
#include "support/test_support.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>
#include <xxhash.h>
#include <nlohmann/json.hpp>

#include <map>

namespace fsdp::checkpoint {
namespace {

using test::exists;
using test::read_bytes;
using test::temp_dir;
using test::write_bytes;
using ::testing::HasSubstr;

constexpr int kNoFsdp = 0;  // "world size" of the single-process reference

train::JobConfig base_options() {
  train::JobConfig o;
  o.model.name = "tiny";
  o.training.steps = 6;
  o.training.global_batch = 12;  // divisible by 1, 2, 3 and 4
  o.training.seq_len = 16;
  o.training.lr = 3e-3;
  o.training.seed = 5;
  o.metrics.quiet = true;
  return o;
}

struct RunResult {
  std::map<int64_t, double> losses;          // by step number
  std::map<std::string, at::Tensor> params;  // the final model, as exported
};

std::string world_name(int world) {
  return world == kNoFsdp ? "no-fsdp" : "W=" + std::to_string(world);
}

// Trains with o at world (kNoFsdp: the reference) and exports the final model. The losses come
// from the run's metrics file (train() returns only the last step's record), whose JSON numbers
// round-trip a double exactly.
RunResult run(train::JobConfig o, int world, const std::string& export_path) {
  o.checkpoint.export_path = export_path;
  o.metrics.path = export_path + ".metrics.jsonl";
  if (world == kNoFsdp) {
    o.parallelism.no_fsdp = true;
    train::train(o, nullptr);
  } else {
    run_ranks_in_threads(
        world, [&](std::shared_ptr<ProcessGroup> group) { train::train(o, group); },
        test::test_options(std::chrono::seconds(60)));
  }
  RunResult r;
  for (const auto& line : test::read_json_lines(o.metrics.path)) {
    r.losses[line.at("step").get<int64_t>()] = line.at("loss").get<double>();
  }
  r.params = load_safetensors(export_path);
  return r;
}

// A world size with a sharding strategy (fsdp-train's --strategy and --replicate).
struct Layout {
  int world = 2;
  std::string strategy = "full_shard";
  int replicate = 1;
  std::string name() const {
    return world_name(world) + (strategy == "full_shard" ? "" : " " + strategy) +
           (replicate == 1 ? "" : " x" + std::to_string(replicate));
  }
  train::JobConfig apply(train::JobConfig o) const {
    o.parallelism.strategy = parse_sharding_strategy(strategy);
    o.parallelism.replicate = replicate;
    return o;
  }
};

// Trains the first half, saves, then resumes in a new model and optimizer for the second half.
RunResult save_then_resume(const Layout& from, const Layout& to, const std::string& dir) {
  train::JobConfig first = from.apply(base_options());
  first.training.steps = 3;
  first.checkpoint.save_dir = dir + "/ckpt";
  run(first, from.world, dir + "/first.safetensors");
  train::JobConfig second = to.apply(base_options());
  second.checkpoint.resume = dir + "/ckpt";
  return run(second, to.world, dir + "/resumed.safetensors");
}
RunResult save_then_resume(int save_world, int resume_world, const std::string& dir) {
  return save_then_resume(Layout{save_world}, Layout{resume_world}, dir);
}

class ExactResume : public ::testing::TestWithParam<int> {};

TEST_P(ExactResume, IsBitIdenticalToAnUninterruptedRun) {
  const int world = GetParam();
  const std::string dir = temp_dir("exact_" + std::to_string(world));
  const RunResult straight = run(base_options(), world, dir + "/straight.safetensors");
  const RunResult resumed = save_then_resume(world, world, dir);
  ASSERT_EQ(resumed.losses.size(), 3u);
  for (const auto& [step, loss] : resumed.losses) {
    EXPECT_EQ(loss, straight.losses.at(step)) << world_name(world) << " step " << step;
  }
  ASSERT_EQ(resumed.params.size(), straight.params.size());
  for (const auto& [name, value] : straight.params) {
    EXPECT_TRUE(at::equal(resumed.params.at(name), value)) << world_name(world) << " " << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, ExactResume, ::testing::Values(kNoFsdp, 1, 2, 4),
                         [](const auto& info) {
                           return info.param == kNoFsdp ? std::string("NoFsdp")
                                                        : "W" + std::to_string(info.param);
                         });

TEST(ShardedCheckpoint, ReshardsAcrossWorldSizesAndStrategies) {
  const std::string dir = temp_dir("reshard");
  const RunResult reference = run(base_options(), kNoFsdp, dir + "/reference.safetensors");
  const std::vector<std::pair<int, int>> cases = {
      {4, 2}, {2, 3}, {2, kNoFsdp}, {kNoFsdp, 2}, {1, 4}};
  for (const auto& [from, to] : cases) {
    const std::string name = world_name(from) + " -> " + world_name(to);
    const RunResult resumed = save_then_resume(from, to, temp_dir("reshard_case"));
    ASSERT_EQ(resumed.losses.size(), 3u) << name;
    for (const auto& [step, loss] : resumed.losses) {
      const double want = reference.losses.at(step);
      EXPECT_NEAR(loss, want, 1e-5 * want) << name << " step " << step;
    }
    for (const auto& [param, value] : reference.params) {
      const double diff = (resumed.params.at(param) - value).abs().max().item<double>();
      EXPECT_LE(diff, 1e-5) << name << " " << param;
    }
  }
}

// HSDP keeps one shard per replica and no_shard the whole model on every rank: a checkpoint
// stores each row once, and loads into any other layout.
TEST(ShardedCheckpoint, MovesBetweenShardingStrategies) {
  const std::string dir = temp_dir("strategies");
  const RunResult reference = run(base_options(), kNoFsdp, dir + "/reference.safetensors");
  const std::vector<std::pair<Layout, Layout>> cases = {
      {{4, "hybrid_shard", 2}, {4, "hybrid_shard", 2}},
      {{4, "hybrid_shard", 2}, {3, "full_shard", 1}},
      {{2, "full_shard", 1}, {4, "hybrid_shard", 2}},
      {{2, "no_shard", 1}, {4, "shard_grad_op", 1}},
      {{4, "full_shard", 1}, {2, "no_shard", 1}},
  };
  for (const auto& [from, to] : cases) {
    const std::string name = from.name() + " -> " + to.name();
    const std::string case_dir = temp_dir("strategies_case");
    const RunResult resumed = save_then_resume(from, to, case_dir);
    ASSERT_EQ(resumed.losses.size(), 3u) << name;
    for (const auto& [step, loss] : resumed.losses) {
      const double want = reference.losses.at(step);
      EXPECT_NEAR(loss, want, 1e-5 * want) << name << " step " << step;
    }
    for (const auto& [param, value] : reference.params) {
      EXPECT_LE((resumed.params.at(param) - value).abs().max().item<double>(), 1e-5)
          << name << " " << param;
    }
    // Each row once: with replicas, the rank files together hold one model's worth of data.
    const std::string ckpt = case_dir + "/ckpt/step_00000003";
    const CheckpointIndex index = parse_checkpoint_index(read_bytes(ckpt + "/metadata.json"));
    uint64_t model_bytes = 0, stored_bytes = 0;
    for (const auto& [key, record] : index.tensors) {
      model_bytes +=
          static_cast<uint64_t>(record.dim0() * record.row_numel() * dtype_size(record.dtype));
    }
    for (const auto& f : index.files)
      stored_bytes += SafetensorsReader(ckpt + "/" + f.name).header().data_bytes;
    EXPECT_EQ(stored_bytes, model_bytes) << name;
  }
}

// --- the library directly ---

models::GPT2LMHead make_model(const models::GPT2Config& config, const DeviceMesh* mesh) {
  return test::make_gpt2(config, /*seed=*/5, mesh);
}

// A checkpoint of the tiny model after 3 steps at 2 ranks, under dir/ckpt.
std::string tiny_checkpoint(const std::string& dir) {
  train::JobConfig o = base_options();
  o.training.steps = 3;
  o.checkpoint.save_dir = dir + "/ckpt";
  run(o, 2, dir + "/export.safetensors");
  return o.checkpoint.save_dir;
}

TEST(ShardedCheckpoint, LoadFillsEveryRanksRowsAndZeroesPadding) {
  const std::string ckpt = tiny_checkpoint(temp_dir("padding"));
  // The full values, loaded into one unsharded model.
  auto full = make_model(models::GPT2Config::tiny(), nullptr);
  auto full_optimizer = test::make_adamw(*full);
  const LoadResult loaded = load_sharded(ckpt, *full, &full_optimizer, nullptr);
  EXPECT_EQ(loaded.step, 3);
  EXPECT_EQ(loaded.saved_world_size, 2);
  std::map<std::string, at::Tensor> want, want_exp_avg;
  for (const auto& [name, p] : unique_named_parameters(*full)) {
    want[name] = p.detach().reshape({p.size(0), -1});
    auto* s = static_cast<torch::optim::AdamWParamState*>(
        full_optimizer.state().at(p.unsafeGetTensorImpl()).get());
    EXPECT_EQ(s->step(), 3) << name;
    want_exp_avg[name] = s->exp_avg().reshape({p.size(0), -1});
  }

  // Three ranks: 256 and 32 rows do not divide by 3, so the last rank holds padding rows.
  run_ranks_in_threads(
      3,
      [&](std::shared_ptr<ProcessGroup> group) {
        DeviceMesh mesh(group);
        auto model = make_model(models::GPT2Config::tiny(), &mesh);
        auto optimizer = test::make_adamw(*model);
        for (const auto& p : unique_parameters(*model)) p.detach().fill_(7.0f);  // padding too
        load_sharded(ckpt, *model, &optimizer, group.get());
        int padded = 0;
        for (const auto& unit : fsdp_modules_under(*model)) {
          for (const auto& sp : unit.sharded_parameters()) {
            const std::string name = unit.path().empty() ? sp.name : unit.path() + "." + sp.name;
            const ShardMetadata& m = sp.metadata;
            const at::Tensor rows = sp.local.detach().reshape({m.padded_rows, -1});
            auto* s = static_cast<torch::optim::AdamWParamState*>(
                optimizer.state().at(sp.local.unsafeGetTensorImpl()).get());
            const at::Tensor state_rows = s->exp_avg().reshape({m.padded_rows, -1});
            EXPECT_EQ(s->step(), 3);
            if (m.local_rows > 0) {
              EXPECT_TRUE(at::equal(rows.narrow(0, 0, m.local_rows),
                                    want.at(name).narrow(0, m.local_offset, m.local_rows)))
                  << name << " rank " << group->rank();
              EXPECT_TRUE(at::equal(state_rows.narrow(0, 0, m.local_rows),
                                    want_exp_avg.at(name).narrow(0, m.local_offset, m.local_rows)))
                  << name << " exp_avg rank " << group->rank();
            }
            if (m.local_rows < m.padded_rows) {
              ++padded;
              const int64_t pad = m.padded_rows - m.local_rows;
              EXPECT_EQ(rows.narrow(0, m.local_rows, pad).abs().sum().item<double>(), 0.0) << name;
              EXPECT_EQ(state_rows.narrow(0, m.local_rows, pad).abs().sum().item<double>(), 0.0)
                  << name;
            }
          }
        }
        if (group->rank() == 2) EXPECT_GT(padded, 0) << "the test should exercise padding";
      },
      test::test_options());
}

// The error every rank of a 2-rank load reports (the first, by rank), or "".
std::string load_error(const std::string& path, const models::GPT2Config& config, int world = 2) {
  if (world == 1) {
    auto model = make_model(config, nullptr);
    auto optimizer = test::make_adamw(*model);
    return test::error_message([&] { load_sharded(path, *model, &optimizer, nullptr); });
  }
  return test::error_message([&] {
    run_ranks_in_threads(
        world,
        [&](std::shared_ptr<ProcessGroup> group) {
          DeviceMesh mesh(group);
          auto model = make_model(config, &mesh);
          auto optimizer = test::make_adamw(*model);
          load_sharded(path, *model, &optimizer, group.get());
        },
        test::test_options());
  });
}

TEST(ShardedCheckpoint, AnotherConfigListsMissingUnexpectedAndMisshapedKeys) {
  const std::string ckpt = tiny_checkpoint(temp_dir("other_config"));
  models::GPT2Config wider = models::GPT2Config::tiny();
  wider.n_embd = 48;
  wider.n_layer = 3;
  const std::string error = load_error(ckpt, wider);
  EXPECT_THAT(error, HasSubstr("does not match the model"));
  EXPECT_THAT(error, HasSubstr("missing from the checkpoint"));
  EXPECT_THAT(error, HasSubstr("transformer.h.2.attn.c_attn.weight [144, 48]"));
  EXPECT_THAT(error, HasSubstr("transformer.wte.weight: checkpoint [256, 32], model [256, 48]"));
  models::GPT2Config shallower = models::GPT2Config::tiny();
  shallower.n_layer = 1;
  const std::string error2 = load_error(ckpt, shallower);
  EXPECT_THAT(error2, HasSubstr("unexpected in the checkpoint"));
  EXPECT_THAT(error2, HasSubstr("transformer.h.1.mlp.c_fc.weight [128, 32]"));
  EXPECT_THAT(error2, ::testing::Not(HasSubstr("mis-shaped")));
}

std::string copy_checkpoint(const std::string& ckpt, const std::string& name) {
  const std::string dir = temp_dir(name) + "/copy";
  test::copy_flat_dir(resolve_checkpoint(ckpt), dir);
  return dir;
}

// Each rank file's checksum in metadata.json is XXH3-64 of the whole file, what
// `xxhsum -H3 FILE` prints, so a copy can be verified without our code.
TEST(ShardedCheckpoint, IndexRecordsEachFilesSizeAndChecksum) {
  const std::string ckpt = tiny_checkpoint(temp_dir("file_checksums")) + "/step_00000003";
  const CheckpointIndex index = parse_checkpoint_index(read_bytes(ckpt + "/metadata.json"));
  ASSERT_EQ(index.files.size(), 2u);
  for (const FileRecord& f : index.files) {
    const std::string bytes = read_bytes(ckpt + "/" + f.name);
    EXPECT_EQ(f.bytes, bytes.size()) << f.name;
    EXPECT_EQ(f.checksum, XXH3_64bits(bytes.data(), bytes.size())) << f.name;
  }
}

TEST(ShardedCheckpoint, BrokenFilesGiveClearErrorsOnEveryRank) {
  const std::string ckpt = tiny_checkpoint(temp_dir("broken"));
  const auto tiny = models::GPT2Config::tiny();
  const std::string rank1 = "/rank_00001-of-00002.safetensors";
  {
    const std::string dir = copy_checkpoint(ckpt, "broken_missing");
    ::unlink((dir + rank1).c_str());
    for (int world : {1, 2, 3}) {
      EXPECT_THAT(load_error(dir, tiny, world),
                  HasSubstr("rank 1's file rank_00001-of-00002.safetensors is missing"))
          << world;
    }
  }
  {
    const std::string dir = copy_checkpoint(ckpt, "broken_truncated");
    const std::string bytes = read_bytes(dir + rank1);
    write_bytes(dir + rank1, bytes.substr(0, bytes.size() / 2));
    EXPECT_THAT(load_error(dir, tiny),
                HasSubstr("the index records " + std::to_string(bytes.size())));
  }
  {
    const std::string dir = copy_checkpoint(ckpt, "broken_header");
    std::string bytes = read_bytes(dir + rank1);
    bytes[9] = '[';  // the header's first quote: no longer JSON
    write_bytes(dir + rank1, bytes);
    EXPECT_THAT(load_error(dir, tiny), HasSubstr("is not a valid safetensors file"));
  }
  {
    const std::string dir = copy_checkpoint(ckpt, "broken_data");
    std::string bytes = read_bytes(dir + rank1);
    bytes[bytes.size() - 5] ^= 0x01;  // one bit of the last tensor
    write_bytes(dir + rank1, bytes);
    for (int world : {1, 2}) {
      const std::string error = load_error(dir, tiny, world);
      EXPECT_THAT(error, HasSubstr("is corrupted"));
      EXPECT_THAT(error, HasSubstr("have checksum"));
    }
  }
  {
    const std::string dir = copy_checkpoint(ckpt, "broken_index");
    std::string text = read_bytes(dir + "/metadata.json");
    const auto pos = text.find("\"step\": 3");
    ASSERT_NE(pos, std::string::npos);
    text[pos + 8] = '4';
    write_bytes(dir + "/metadata.json", text);
    EXPECT_THAT(load_error(dir, tiny), HasSubstr("checksum does not match its content"));
    write_bytes(dir + "/metadata.json", text.substr(0, 100));
    EXPECT_THAT(load_error(dir, tiny), HasSubstr("not valid JSON"));
  }
  EXPECT_THAT(load_error(temp_dir("broken_empty"), tiny), HasSubstr("no checkpoint at"));
}

TEST(ShardedCheckpoint, LeftoversOfACrashedSaveAreIgnoredAndCleaned) {
  const std::string root = temp_dir("leftovers") + "/root";
  auto model = make_model(models::GPT2Config::tiny(), nullptr);
  save_sharded(root, *model, nullptr, nullptr, SaveOptions().step(1));
  // What a save killed mid-write leaves: a partial temporary directory.
  ::mkdir((root + "/.tmp-step_00000002").c_str(), 0755);
  write_bytes(root + "/.tmp-step_00000002/rank_00000-of-00001.safetensors", "partial");
  EXPECT_EQ(resolve_checkpoint(root), root + "/step_00000001");
  EXPECT_EQ(load_sharded(root, *model, nullptr, nullptr).step, 1);
  save_sharded(root, *model, nullptr, nullptr, SaveOptions().step(2).keep_last(1));
  EXPECT_FALSE(exists(root + "/.tmp-step_00000002"));
  EXPECT_FALSE(exists(root + "/step_00000001")) << "keep_last(1) prunes older checkpoints";
  EXPECT_EQ(resolve_checkpoint(root), root + "/step_00000002");
  // Saving the same step again replaces it atomically.
  save_sharded(root, *model, nullptr, nullptr, SaveOptions().step(2));
  EXPECT_EQ(load_sharded(root, *model, nullptr, nullptr).step, 2);
}

}  // namespace
}  // namespace fsdp::checkpoint
