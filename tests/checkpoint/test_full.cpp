// Full checkpoints in Hugging Face's GPT-2 layout: the same file from every world size, the
// right names and transposes, loading back into sharded models (every rank's rows, padding
// zero), bf16, files written by other tools, and clear errors for mismatched or broken files.
#include <fsdp/checkpoint/checkpoint.h>
#include <fsdp/checkpoint/safetensors.h>
#include <fsdp/comm/rendezvous.h>
#include <fsdp/device_mesh.h>
#include <fsdp/fully_shard.h>
#include <fsdp/util/memory_counter.h>
#include <models/gpt2/gpt2.h>
#include <models/gpt2/hf.h>

#include "support/checkpoint_util.h"
#include "support/test_support.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace fsdp::checkpoint {
namespace {

using test::make_gpt2;
using test::read_bytes;
using test::temp_dir;
using test::write_bytes;
using ::testing::HasSubstr;

ExportOptions hf_export() { return ExportOptions().layout(models::gpt2_hf_layout()); }

void export_at(int world, const std::string& path, const ExportOptions& options = hf_export()) {
  if (world == 0) {
    auto model = make_gpt2(models::GPT2Config::tiny(), 5, nullptr);
    save_full(path, *model, nullptr, options);
    return;
  }
  run_ranks_in_threads(
      world,
      [&](std::shared_ptr<ProcessGroup> group) {
        DeviceMesh mesh(group);
        auto model = make_gpt2(models::GPT2Config::tiny(), 5, &mesh);
        save_full(path, *model, group.get(), options);
      },
      test::test_options());
}

TEST(FullCheckpoint, IsTheSameFileFromEveryWorldSize) {
  const std::string dir = temp_dir("full_same");
  export_at(0, dir + "/plain.safetensors");
  const std::string want = read_bytes(dir + "/plain.safetensors");
  ASSERT_FALSE(want.empty());
  for (int world : {1, 2, 3, 4}) {
    const std::string path = dir + "/w" + std::to_string(world) + ".safetensors";
    export_at(world, path);
    EXPECT_TRUE(read_bytes(path) == want) << "W=" << world;
  }
}

TEST(FullCheckpoint, UsesHuggingFaceNamesAndConv1DLayout) {
  const std::string path = temp_dir("full_layout") + "/model.safetensors";
  export_at(2, path);
  auto model = make_gpt2(models::GPT2Config::tiny(), 5, nullptr);
  const auto file = load_safetensors(path);
  EXPECT_EQ(file.count("lm_head.weight"), 0u) << "tied to transformer.wte.weight, stored once";
  const auto params = unique_named_parameters(*model);
  EXPECT_EQ(file.size(), params.size());
  for (const auto& [name, p] : params) {
    ASSERT_EQ(file.count(name), 1u) << name;
    const bool conv1d = name.find("c_attn.weight") != std::string::npos ||
                        name.find("c_proj.weight") != std::string::npos ||
                        name.find("c_fc.weight") != std::string::npos;
    EXPECT_TRUE(at::equal(file.at(name), conv1d ? p.detach().t() : p.detach())) << name;
  }
  EXPECT_EQ(file.at("transformer.h.0.mlp.c_fc.weight").sizes(), (std::vector<int64_t>{32, 128}));
  SafetensorsReader reader(path);
  EXPECT_EQ(reader.header().metadata.at("format"), "pt");
  EXPECT_TRUE(reader.verify_data_checksum());
}

TEST(FullCheckpoint, LoadsIntoShardedModelsRowByRow) {
  const std::string path = temp_dir("full_load") + "/model.safetensors";
  export_at(0, path);
  auto want_model = make_gpt2(models::GPT2Config::tiny(), 5, nullptr);
  std::map<std::string, at::Tensor> want;
  for (const auto& [name, p] : unique_named_parameters(*want_model))
    want[name] = p.detach().reshape({p.size(0), -1});
  for (int world : {1, 3, 4}) {
    run_ranks_in_threads(
        world,
        [&](std::shared_ptr<ProcessGroup> group) {
          DeviceMesh mesh(group);
          auto model = make_gpt2(models::GPT2Config::tiny(), 9, &mesh);  // other values
          for (const auto& p : unique_parameters(*model)) p.detach().fill_(3.0f);
          load_full(path, *model, group.get(), models::gpt2_hf_layout());
          for (const auto& unit : fsdp_modules_under(*model)) {
            for (const auto& sp : unit.sharded_parameters()) {
              const std::string name = unit.path().empty() ? sp.name : unit.path() + "." + sp.name;
              const ShardMetadata& m = sp.metadata;
              const at::Tensor rows = sp.local.detach().reshape({m.padded_rows, -1});
              EXPECT_TRUE(at::equal(rows.narrow(0, 0, m.local_rows),
                                    want.at(name).narrow(0, m.local_offset, m.local_rows)))
                  << name << " W=" << world << " rank " << group->rank();
              EXPECT_EQ(rows.narrow(0, m.local_rows, m.padded_rows - m.local_rows)
                            .abs()
                            .sum()
                            .item<double>(),
                        0.0);
            }
          }
        },
        test::test_options());
  }
}

TEST(FullCheckpoint, Bf16ExportHoldsRoundedValuesAndLoadsIntoFloat32) {
  const std::string path = temp_dir("full_bf16") + "/model.safetensors";
  export_at(2, path, hf_export().dtype(at::kBFloat16));
  auto want = make_gpt2(models::GPT2Config::tiny(), 5, nullptr);
  const auto file = load_safetensors(path);
  const at::Tensor wte = want->transformer->wte->weight.detach();
  EXPECT_EQ(file.at("transformer.wte.weight").scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(file.at("transformer.wte.weight"), wte.to(at::kBFloat16)));
  auto model = make_gpt2(models::GPT2Config::tiny(), 9, nullptr);
  load_full(path, *model, nullptr, models::gpt2_hf_layout());
  EXPECT_TRUE(
      at::equal(model->transformer->wte->weight.detach(), wte.to(at::kBFloat16).to(at::kFloat)));
}

// The export gathers one parameter at a time: beyond its shards, rank 0 never allocates more
// than a few copies of the largest parameter (the gathered rows, the layout's transpose), far
// less than the model it writes.
TEST(FullCheckpoint, RankZeroHoldsOneGatheredTensorAtATime) {
  const models::GPT2Config config{256, 64, 32, 12, 2};  // tiny with 12 blocks
  const std::string path = temp_dir("full_memory") + "/model.safetensors";
  int64_t model_bytes = 0, largest = 0, peak_extra = -1;
  {
    auto plain = make_gpt2(config, 5, nullptr);
    for (const auto& [name, p] : unique_named_parameters(*plain)) {
      model_bytes += p.nbytes();
      largest = std::max<int64_t>(largest, p.nbytes());
    }
  }
  run_ranks_in_threads(
      2,
      [&](std::shared_ptr<ProcessGroup> group) {
        DeviceMesh mesh(group);
        auto model = make_gpt2(config, 5, &mesh);
        auto counter = std::make_shared<MemoryCounter>();
        CountAllocations count(counter);
        save_full(path, *model, group.get(), hf_export());
        if (group->rank() == 0) peak_extra = counter->peak_bytes();
      },
      test::test_options());
  ASSERT_GT(peak_extra, 0);
  EXPECT_LE(peak_extra, 3 * largest) << "largest parameter " << largest << " bytes";
  EXPECT_LT(6 * peak_extra, model_bytes) << "model " << model_bytes << " bytes";
  // And the file holds the whole model.
  const auto file = load_safetensors(path);
  int64_t stored = 0;
  for (const auto& [name, t] : file) stored += t.nbytes();
  EXPECT_EQ(stored, model_bytes);
}

TEST(FullCheckpoint, ReadsFilesInTheHubsOriginalNaming) {
  // The hub's gpt2 file: no "transformer." prefix, attn.bias mask buffers, and (some tools)
  // a stored lm_head.weight.
  auto source = make_gpt2(models::GPT2Config::tiny(), 5, nullptr);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  const auto layout = models::gpt2_hf_layout();
  for (const auto& [name, p] : unique_named_parameters(*source)) {
    const at::Tensor value = layout.transposed()(name) ? p.detach().t() : p.detach();
    tensors.emplace_back(name.substr(std::string("transformer.").size()), value);
  }
  tensors.emplace_back("h.0.attn.bias", at::ones({1, 1, 64, 64}));
  tensors.emplace_back("h.1.attn.masked_bias", at::scalar_tensor(-1e4));
  tensors.emplace_back("lm_head.weight", source->transformer->wte->weight.detach());
  const std::string path = temp_dir("full_hub") + "/model.safetensors";
  save_safetensors(path, tensors, {{"format", "pt"}});
  auto model = make_gpt2(models::GPT2Config::tiny(), 9, nullptr);
  load_full(path, *model, nullptr, layout);
  for (const auto& [name, p] : unique_named_parameters(*model)) {
    EXPECT_TRUE(at::equal(p.detach(), source->named_parameters()[name].detach())) << name;
  }
}

TEST(FullCheckpoint, MismatchedOrBrokenFilesGiveClearErrors) {
  const std::string dir = temp_dir("full_errors");
  models::GPT2Config wider = models::GPT2Config::tiny();
  wider.n_embd = 48;
  wider.n_layer = 3;
  auto wide = make_gpt2(wider, 5, nullptr);
  save_full(dir + "/wide.safetensors", *wide, nullptr, hf_export());
  auto model = make_gpt2(models::GPT2Config::tiny(), 5, nullptr);
  const std::string error = test::error_message(
      [&] { load_full(dir + "/wide.safetensors", *model, nullptr, models::gpt2_hf_layout()); });
  EXPECT_THAT(error, HasSubstr("does not match the model"));
  EXPECT_THAT(error, HasSubstr("unexpected in the file (12)"));
  EXPECT_THAT(error, HasSubstr("transformer.h.2.attn.c_attn.weight [48, 144]"));
  EXPECT_THAT(
      error,
      HasSubstr("transformer.h.0.attn.c_attn.weight: file [48, 144], model expects [32, 96]"));

  export_at(0, dir + "/model.safetensors");
  const std::string bytes = read_bytes(dir + "/model.safetensors");
  std::string corrupted = bytes;
  corrupted[bytes.size() - 2] ^= 0x40;  // the last tensor, transformer.wpe.weight... or any
  write_bytes(dir + "/corrupted.safetensors", corrupted);
  write_bytes(dir + "/truncated.safetensors", bytes.substr(0, bytes.size() - 100));
  for (const char* name : {"corrupted", "truncated"}) {
    const std::string path = dir + "/" + name + ".safetensors";
    const std::string got = test::error_message([&] {
      run_ranks_in_threads(
          2,
          [&](std::shared_ptr<ProcessGroup> group) {
            DeviceMesh mesh(group);
            auto sharded = make_gpt2(models::GPT2Config::tiny(), 5, &mesh);
            load_full(path, *sharded, group.get(), models::gpt2_hf_layout());
          },
          test::test_options());
    });
    EXPECT_THAT(got, HasSubstr(std::string(name) == "corrupted" ? "is corrupted" : "truncated"))
        << name;
  }
}

}  // namespace
}  // namespace fsdp::checkpoint
