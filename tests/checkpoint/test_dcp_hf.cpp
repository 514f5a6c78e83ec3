// Checkpoints in PyTorch DCP's Hugging Face layout (include/fsdp/checkpoint/dcp_hf.h), in
// process: the layout's parsers on hand-made headers (FSDP2's empty chunks and 0-D steps
// included), then save at 2 ranks and load at 3 and at 1 against our own sharded format as the
// oracle, the files being what HuggingFaceStorageReader expects, and every broken or foreign
// checkpoint refused with an error that names the file and the fault. The round trips through
// PyTorch itself are tests/tools/test_dcp_interop.cpp.
#include <fsdp/checkpoint/checkpoint.h>
#include <fsdp/checkpoint/dcp_hf.h>
#include <fsdp/checkpoint/format.h>
#include <fsdp/checkpoint/safetensors.h>
#include <fsdp/comm/rendezvous.h>
#include <fsdp/device_mesh.h>
#include <fsdp/fully_shard.h>
#include <models/gpt2/gpt2.h>

#include "support/checkpoint_util.h"
#include "support/test_support.h"

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/optim/adamw.h>
#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <string>

namespace fsdp::checkpoint {
namespace {

using test::read_bytes;
using test::temp_dir;
using test::write_bytes;
using ::testing::HasSubstr;

// --- the layout's parsers ---

TensorEntry entry(const std::string& name, std::vector<int64_t> shape) {
  TensorEntry e;
  e.name = name;
  e.shape = std::move(shape);
  return e;
}

// A header holding entries, with DCP_SHARDING_INFO of offsets (by name) unless info is given.
SafetensorsHeader header_of(std::vector<TensorEntry> entries,
                            const std::map<std::string, std::vector<int64_t>>& offsets,
                            std::optional<std::string> info = std::nullopt) {
  SafetensorsHeader h;
  assign_offsets(entries);
  h.entries = std::move(entries);
  h.metadata = dcp_file_metadata(offsets);
  if (info) h.metadata[kDcpShardingInfoKey] = *info;
  return h;
}

std::string assemble_error(const std::vector<SafetensorsHeader>& headers) {
  std::vector<DcpFileHeader> files;
  for (size_t i = 0; i < headers.size(); ++i)
    files.push_back({"f" + std::to_string(i), &headers[i]});
  try {
    assemble_dcp_tensors(files);
  } catch (const FormatError& e) {
    return e.what();
  }
  return "";
}

// What FSDP2 writes at W = 3 for a [4, 1] weight and a [1] bias (checked with torch 2.11): rows
// 0-1, 2-3 and an empty chunk at row 4; the bias on rank 0, an empty chunk on rank 2 at 1. The
// AdamW step of a parameter, 0-D, on one rank.
TEST(DcpHfFormat, AssemblesFsdp2sChunksDroppingEmptyOnes) {
  const std::vector<SafetensorsHeader> h = {
      header_of({entry("w", {2, 1}), entry("b", {1}), entry("state.w.step", {})},
                {{"w", {0, 0}}, {"b", {0}}, {"state.w.step", {}}}),
      header_of({entry("w", {2, 1})}, {{"w", {2, 0}}}),
      header_of({entry("w", {0, 1}), entry("b", {0})}, {{"w", {4, 0}}, {"b", {1}}})};
  std::vector<DcpFileHeader> files;
  for (size_t i = 0; i < h.size(); ++i) files.push_back({"f" + std::to_string(i), &h[i]});
  const auto tensors = assemble_dcp_tensors(files);
  ASSERT_EQ(tensors.size(), 3u);
  EXPECT_EQ(tensors.at("w").shape, (std::vector<int64_t>{4, 1}));
  ASSERT_EQ(tensors.at("w").chunks.size(), 2u);
  EXPECT_EQ(tensors.at("w").chunks[1].file, 1u);
  EXPECT_EQ(tensors.at("w").chunks[1].offsets, (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(tensors.at("b").shape, (std::vector<int64_t>{1}));
  EXPECT_TRUE(tensors.at("state.w.step").shape.empty());
  EXPECT_EQ(tensors.at("state.w.step").chunks.size(), 1u);
}

TEST(DcpHfFormat, RefusesGapsOverlapsAndBadShardingInfo) {
  const auto w = [](int64_t rows, int64_t offset) {
    return header_of({entry("w", {rows, 3})}, {{"w", {offset, 0}}});
  };
  EXPECT_THAT(assemble_error({w(2, 0), w(2, 4)}),
              HasSubstr("its chunks cover 12 of its 18 elements (a rank's file is missing"));
  EXPECT_THAT(assemble_error({w(3, 0), w(3, 2)}),
              HasSubstr("chunk [2:5, 0:3] in 'f1' overlaps chunk [0:3, 0:3] in 'f0'"));
  EXPECT_THAT(assemble_error({header_of({entry("w", {2, 3})}, {}, "{\"w\": {\"saved_offsets\"")}),
              HasSubstr("'f0': DCP_SHARDING_INFO is not valid JSON"));
  EXPECT_THAT(assemble_error({header_of({entry("w", {2, 3})}, {{"w", {0}}})}),
              HasSubstr("gives 1 offsets for a tensor of 2 dimensions [2, 3]"));
  EXPECT_THAT(assemble_error({header_of({entry("w", {2, 3})}, {{"v", {0, 0}}})}),
              HasSubstr("'f0': DCP_SHARDING_INFO has no offsets for tensor 'w'"));
  EXPECT_THAT(assemble_error({header_of({entry("w", {2, 3})}, {{"w", {0, 0}}, {"v", {0}}})}),
              HasSubstr("gives offsets for 'v', which the file does not hold"));
  EXPECT_THAT(
      assemble_error({header_of({entry("w", {2, 3})}, {}, R"({"w": {"saved_offsets": [-1, 0]}})")}),
      HasSubstr("must be a non-negative integer"));
  std::vector<TensorEntry> bf16 = {entry("w", {2, 3})};
  bf16[0].dtype = Dtype::kBF16;
  EXPECT_THAT(assemble_error({w(2, 0), header_of(bf16, {{"w", {2, 0}}})}),
              HasSubstr("tensor 'w' is BF16 with 2 dimensions in 'f1' but F32 with 2"));
  // Two ranks holding the same 0-D step: DCP writes each replicated tensor once.
  const auto step = header_of({entry("s", {})}, {{"s", {}}});
  EXPECT_THAT(assemble_error({step, step}), HasSubstr("overlaps"));
}

TEST(DcpHfFormat, ManifestRoundTripsAndRefusesForeignPaths) {
  DcpManifest m;
  m.world_size = 2;
  m.step = 7;
  m.files = {{"model/" + dcp_shard_file_name(0), 100}, {"optim/" + dcp_shard_file_name(1), 50}};
  m.rng_states = {"ab", "cd"};
  m.user_json = R"({"k":1})";
  m.grad_scaler = GradScalerRecord{1024, 3, 2, 0.5, 2000};
  const std::string text = serialize_dcp_manifest(m);
  const DcpManifest back = parse_dcp_manifest(text);
  EXPECT_EQ(back.step, 7);
  EXPECT_EQ(back.files.size(), 2u);
  EXPECT_EQ(back.files[0].path, "model/shard-00001-model-00001-of-00001.safetensors");
  EXPECT_EQ(back.rng_states, m.rng_states);
  EXPECT_EQ(back.user_json, m.user_json);
  ASSERT_TRUE(back.grad_scaler.has_value());
  EXPECT_EQ(back.grad_scaler->growth_tracker, 3);
  std::string tampered = text;
  tampered.replace(tampered.find("\"step\": 7"), 9, "\"step\": 8");
  EXPECT_THROW(
      {
        try {
          parse_dcp_manifest(tampered);
        } catch (const FormatError& e) {
          EXPECT_THAT(e.what(), HasSubstr("checksum does not match its content"));
          throw;
        }
      },
      FormatError);
  for (const char* path :
       {"../x.safetensors", "model/../../x.safetensors", "other/x.safetensors", "model/x.bin"}) {
    DcpManifest bad = m;
    bad.files[0].path = path;
    EXPECT_THROW(parse_dcp_manifest(serialize_dcp_manifest(bad)), FormatError) << path;
  }
}

// --- save and load ---

constexpr double kLr = 3e-3;

models::GPT2LMHead make_dcp_model(const DeviceMesh* mesh, const ShardPlacementFn& placement = {}) {
  models::GPT2Options options(models::GPT2Config::tiny());
  options.seed(5);
  FullyShardOptions shard;
  shard.shard_placement_fn(placement);
  if (mesh != nullptr) {
    options.on_block_built(
        [mesh, shard](const std::string&, const std::shared_ptr<torch::nn::Module>& block) {
          fully_shard(block, *mesh, shard);
        });
  }
  models::GPT2LMHead model(options);
  if (mesh != nullptr) fully_shard(model, *mesh, shard);
  return model;
}

// Two AdamW steps on this rank's batches, so that every parameter has moments and a step.
void train_two_steps(models::GPT2LMHead& model, torch::optim::AdamW& optimizer, int rank) {
  for (int step = 0; step < 2; ++step) {
    at::manual_seed(100 * step + rank);
    const at::Tensor idx = at::randint(256, {2, 16}, at::kLong);
    optimizer.zero_grad();
    models::loss(fsdp::forward(model, idx), idx).backward();
    optimizer.step();
  }
}

// Saves the same trained state in both formats, root/sharded and root/dcp: at 2 ranks, or with
// replicate > 1 at 4 ranks on a replicate x 2 HSDP mesh.
void save_both(const std::string& root, const ShardPlacementFn& placement = {}, int replicate = 1) {
  run_ranks_in_threads(
      2 * replicate,
      [&](std::shared_ptr<ProcessGroup> group) {
        const DeviceMesh mesh =
            replicate > 1 ? DeviceMesh::hybrid(group, replicate) : DeviceMesh(group);
        auto model = make_dcp_model(&mesh, placement);
        auto optimizer = test::make_adamw(*model);
        train_two_steps(model, optimizer, group->rank());
        const auto options = SaveOptions().step(2).user_json(R"({"run":"a"})");
        save_sharded(root + "/sharded", *model, &optimizer, group.get(), options);
        save_dcp_hf(root + "/dcp", *model, &optimizer, group.get(), options);
      },
      test::test_options());
}

// The full values of every parameter and AdamW state, by "<name>" and "<kind>/<name>".
std::map<std::string, at::Tensor> full_state(const torch::nn::Module& model,
                                             torch::optim::AdamW& optimizer) {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, p] : unique_named_parameters(model)) {
    out[name] = p.detach().clone();
    auto* s = static_cast<torch::optim::AdamWParamState*>(
        optimizer.state().at(p.unsafeGetTensorImpl()).get());
    out["exp_avg/" + name] = s->exp_avg().clone();
    out["exp_avg_sq/" + name] = s->exp_avg_sq().clone();
    out["step/" + name] = at::scalar_tensor(static_cast<double>(s->step()));
  }
  return out;
}

// The checkpoint at path loaded into one unsharded model.
std::map<std::string, at::Tensor> load_whole(const std::string& path,
                                             LoadResult* result = nullptr) {
  auto model = make_dcp_model(nullptr);
  auto optimizer = test::make_adamw(*model);
  const LoadResult r = load_checkpoint(path, *model, &optimizer, nullptr);
  if (result != nullptr) *result = r;
  return full_state(*model, optimizer);
}

void expect_same_state(const std::map<std::string, at::Tensor>& got,
                       const std::map<std::string, at::Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [key, t] : want) EXPECT_TRUE(at::equal(got.at(key), t)) << key;
}

class DcpHfCheckpoint : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new std::string(temp_dir("dcp_hf"));
    save_both(*root_);
  }
  static void TearDownTestSuite() { delete root_; }
  static std::string dcp() { return *root_ + "/dcp"; }
  static std::string step_dir() { return dcp() + "/step_00000002"; }
  // A copy of the DCP checkpoint to break.
  static std::string copy(const std::string& name) {
    const std::string dir = temp_dir("dcp_hf_" + name) + "/ckpt";
    ::mkdir(dir.c_str(), 0755);
    write_bytes(dir + "/" + kDcpManifestName, read_bytes(step_dir() + "/" + kDcpManifestName));
    for (const char* part : {kDcpModelDir, kDcpOptimDir})
      test::copy_flat_dir(step_dir() + "/" + part, dir + "/" + part);
    return dir;
  }
  static std::string* root_;
};
std::string* DcpHfCheckpoint::root_ = nullptr;

TEST_F(DcpHfCheckpoint, LoadsUnshardedExactlyAsOurShardedFormat) {
  LoadResult r;
  const auto got = load_whole(dcp(), &r);
  expect_same_state(got, load_whole(*root_ + "/sharded"));
  EXPECT_EQ(checkpoint_format_of(dcp()), CheckpointFormat::kDcpHf);
  EXPECT_EQ(checkpoint_format_of(*root_ + "/sharded"), CheckpointFormat::kSharded);
  EXPECT_EQ(r.path, step_dir());
  EXPECT_EQ(r.step, 2);
  EXPECT_EQ(r.saved_world_size, 2);
  EXPECT_EQ(nlohmann::json::parse(r.user_json)["run"], "a");
  EXPECT_EQ(got.at("step/transformer.wte.weight").item<double>(), 2.0);
}

// What HuggingFaceStorageReader reads: model/ and optim/ each one file per rank, named as DCP
// names them, every chunk at its DCP_SHARDING_INFO offsets and no padding; each step once.
TEST_F(DcpHfCheckpoint, FilesAreWhatDcpsReaderExpects) {
  for (const char* part : {kDcpModelDir, kDcpOptimDir}) {
    std::vector<SafetensorsReader> readers;
    std::vector<DcpFileHeader> headers;
    for (int r = 0; r < 2; ++r) {
      readers.emplace_back(step_dir() + "/" + part + "/" + dcp_shard_file_name(r));
      EXPECT_EQ(readers.back().header().metadata.at(kDcpVersionKey), "1.0");
      EXPECT_EQ(readers.back().header().metadata.at("format"), "pt");
    }
    for (const auto& r : readers) headers.push_back({r.path(), &r.header()});
    const auto tensors = assemble_dcp_tensors(headers);
    const auto wte =
        tensors.at(part == std::string(kDcpModelDir) ? "transformer.wte.weight"
                                                     : "state.transformer.wte.weight.exp_avg");
    EXPECT_EQ(wte.shape, (std::vector<int64_t>{256, 32}));
    ASSERT_EQ(wte.chunks.size(), 2u);
    EXPECT_EQ(wte.chunks[1].offsets, (std::vector<int64_t>{128, 0}));
    if (part == std::string(kDcpOptimDir)) {
      const DcpTensor& step = tensors.at("state.transformer.wte.weight.step");
      EXPECT_TRUE(step.shape.empty());
      EXPECT_EQ(
          readers[step.chunks[0].file].header().find("state.transformer.wte.weight.step")->dtype,
          Dtype::kF32);
    } else {
      EXPECT_EQ(tensors.count("lm_head.weight"), 0u) << "a tied parameter is stored once";
    }
  }
}

TEST_F(DcpHfCheckpoint, ReshardsFromTwoRanksToThree) {
  const auto want = load_whole(*root_ + "/sharded");
  run_ranks_in_threads(
      3,
      [&](std::shared_ptr<ProcessGroup> group) {
        DeviceMesh mesh(group);
        auto model = make_dcp_model(&mesh);
        auto optimizer = test::make_adamw(*model);
        for (const auto& p : unique_parameters(*model)) p.detach().fill_(7.0f);  // padding too
        load_dcp_hf(dcp(), *model, &optimizer, group.get());
        int padded = 0;
        for (const auto& unit : fsdp_modules_under(*model)) {
          for (const auto& sp : unit.sharded_parameters()) {
            const std::string name = unit.path().empty() ? sp.name : unit.path() + "." + sp.name;
            const ShardMetadata& m = sp.metadata;
            const at::Tensor rows = sp.local.detach().reshape({m.padded_rows, -1});
            auto* s = static_cast<torch::optim::AdamWParamState*>(
                optimizer.state().at(sp.local.unsafeGetTensorImpl()).get());
            const at::Tensor moments = s->exp_avg_sq().reshape({m.padded_rows, -1});
            EXPECT_EQ(s->step(), 2) << name;
            const auto mine = [&](const std::string& key) {
              return want.at(key)
                  .reshape({want.at(key).size(0), -1})
                  .narrow(0, m.local_offset, m.local_rows);
            };
            EXPECT_TRUE(at::equal(rows.narrow(0, 0, m.local_rows), mine(name))) << name;
            EXPECT_TRUE(at::equal(moments.narrow(0, 0, m.local_rows), mine("exp_avg_sq/" + name)))
                << name;
            if (m.local_rows < m.padded_rows) {
              ++padded;
              EXPECT_EQ(rows.narrow(0, m.local_rows, m.padded_rows - m.local_rows)
                            .abs()
                            .sum()
                            .item<double>(),
                        0.0)
                  << name;
            }
          }
        }
        if (group->rank() == 2) EXPECT_GT(padded, 0) << "the test should exercise padding";
      },
      test::test_options());
}

// FSDP2's shard_placement_fn: a Shard(1) parameter is stored as each rank's slab of columns.
TEST(DcpHfCheckpointPlacement, Shard1SlabsLoadAsOurShardedFormatDoes) {
  const std::string root = temp_dir("dcp_hf_shard1");
  save_both(root, [](const std::string&, const at::Tensor& p) -> std::optional<int64_t> {
    return p.dim() > 1 ? std::optional<int64_t>(1) : std::nullopt;
  });
  expect_same_state(load_whole(root + "/dcp"), load_whole(root + "/sharded"));
  const SafetensorsReader rank1(root + "/dcp/step_00000002/model/" + dcp_shard_file_name(1));
  const auto offsets = parse_dcp_offsets(rank1.header());
  EXPECT_EQ(offsets.at("transformer.h.0.mlp.c_fc.weight"), (std::vector<int64_t>{0, 16}));
  EXPECT_EQ(rank1.entry("transformer.h.0.mlp.c_fc.weight").shape, (std::vector<int64_t>{128, 16}));
}

// HSDP: the second replica holds the same rows as the first and writes nothing.
TEST(DcpHfCheckpointPlacement, HybridShardReplicasAreStoredOnce) {
  const std::string root = temp_dir("dcp_hf_hsdp");
  save_both(root, {}, /*replicate=*/2);
  expect_same_state(load_whole(root + "/dcp"), load_whole(root + "/sharded"));
  const DcpManifest m = parse_dcp_manifest(read_bytes(root + "/dcp/step_00000002/fsdp.json"));
  EXPECT_EQ(m.world_size, 4);
  std::vector<std::string> paths;
  for (const auto& f : m.files) paths.push_back(f.path);
  EXPECT_THAT(paths, ::testing::ElementsAre(
                         "model/" + dcp_shard_file_name(0), "model/" + dcp_shard_file_name(1),
                         "optim/" + dcp_shard_file_name(0), "optim/" + dcp_shard_file_name(1)));
}

// The error every rank of a 2-rank load reports.
std::string dcp_load_error(const std::string& path) {
  return test::error_message([&] {
    run_ranks_in_threads(
        2,
        [&](std::shared_ptr<ProcessGroup> group) {
          DeviceMesh mesh(group);
          auto model = make_dcp_model(&mesh);
          auto optimizer = test::make_adamw(*model);
          load_dcp_hf(path, *model, &optimizer, group.get());
        },
        test::test_options());
  });
}

// Rewrites a rank file with its DCP_SHARDING_INFO replaced (data untouched).
void set_sharding_info(const std::string& path, const std::string& info) {
  const std::string bytes = read_bytes(path);
  const SafetensorsHeader h =
      parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  auto metadata = h.metadata;
  metadata[kDcpShardingInfoKey] = info;
  write_bytes(path, encode_safetensors_header(h.entries, metadata) + bytes.substr(h.data_offset));
}

TEST_F(DcpHfCheckpoint, WithoutTheManifestLoadsAsFsdp2sCheckpoints) {
  const std::string dir = copy("no_manifest");
  ::unlink((dir + "/" + kDcpManifestName).c_str());
  LoadResult r;
  expect_same_state(load_whole(dir, &r), load_whole(dcp()));
  EXPECT_EQ(r.step, 2);  // from the optimizer's steps
  EXPECT_EQ(r.user_json, "{}");
  EXPECT_EQ(r.saved_world_size, 2);
}

std::string rank1_model_file() { return std::string(kDcpModelDir) + "/" + dcp_shard_file_name(1); }

TEST_F(DcpHfCheckpoint, FilesThatDisagreeWithTheManifestAreRefused) {
  const std::string rank1 = rank1_model_file();
  {
    const std::string dir = copy("missing");
    ::unlink((dir + "/" + rank1).c_str());
    EXPECT_THAT(dcp_load_error(dir), HasSubstr(rank1 + " is missing"));
  }
  {
    const std::string dir = copy("truncated");
    const std::string bytes = read_bytes(dir + "/" + rank1);
    write_bytes(dir + "/" + rank1, bytes.substr(0, bytes.size() / 2));
    EXPECT_THAT(dcp_load_error(dir),
                HasSubstr(rank1 + " has " + std::to_string(bytes.size() / 2) +
                          " bytes, the manifest records " + std::to_string(bytes.size())));
  }
  {
    const std::string dir = copy("stray");
    write_bytes(dir + "/model/extra.safetensors", read_bytes(dir + "/" + rank1));
    EXPECT_THAT(dcp_load_error(dir), HasSubstr("model/extra.safetensors is not in the manifest"));
  }
  {
    const std::string dir = copy("bit_flip");
    std::string bytes = read_bytes(dir + "/" + rank1);
    bytes[bytes.size() - 5] ^= 0x01;
    write_bytes(dir + "/" + rank1, bytes);
    const std::string error = dcp_load_error(dir);
    EXPECT_THAT(error, HasSubstr(dcp_shard_file_name(1) + "' is corrupted: tensor"));
    EXPECT_THAT(error, HasSubstr("has checksum"));
  }
  {
    const std::string dir = copy("manifest");
    std::string text = read_bytes(dir + "/" + kDcpManifestName);
    text.replace(text.find("\"step\": 2"), 9, "\"step\": 9");
    write_bytes(dir + "/" + kDcpManifestName, text);
    EXPECT_THAT(dcp_load_error(dir), HasSubstr("fsdp.json' is not a valid manifest: the manifest's "
                                               "checksum does not match its content"));
  }
}

// As FSDP2 leaves them: no manifest, so the files' own metadata is all there is to check.
TEST_F(DcpHfCheckpoint, BadShardingInfoIsRefusedNamingTheFileAndFault) {
  const std::string rank1 = rank1_model_file();
  {
    const std::string dir = copy("missing_no_manifest");
    ::unlink((dir + "/" + kDcpManifestName).c_str());
    ::unlink((dir + "/" + rank1).c_str());
    const std::string error = dcp_load_error(dir);
    EXPECT_THAT(error, HasSubstr("there is no fsdp.json to list the files: a rank's file may be "
                                 "missing"));
    EXPECT_THAT(error, HasSubstr("transformer.h.0.attn.c_attn.weight: checkpoint [48, 32], model "
                                 "[96, 32]"));
  }
  {
    const std::string dir = copy("bad_info");
    ::unlink((dir + "/" + kDcpManifestName).c_str());
    set_sharding_info(dir + "/" + rank1, "{not json");
    EXPECT_THAT(dcp_load_error(dir),
                HasSubstr(dcp_shard_file_name(1) + "': DCP_SHARDING_INFO is not valid JSON"));
  }
  {
    const std::string dir = copy("overlap");
    ::unlink((dir + "/" + kDcpManifestName).c_str());
    const SafetensorsReader r(dir + "/" + rank1);
    nlohmann::json info = nlohmann::json::parse(r.header().metadata.at(kDcpShardingInfoKey));
    info["transformer.wte.weight"]["saved_offsets"] = {100, 0};  // rows 100-227: overlaps rank 0
    set_sharding_info(dir + "/" + rank1, info.dump());
    EXPECT_THAT(dcp_load_error(dir),
                HasSubstr("tensor 'transformer.wte.weight': chunk [100:228, 0:32] in '"));
  }
}

TEST_F(DcpHfCheckpoint, AnotherModelListsMissingUnexpectedAndMisshapedTensors) {
  models::GPT2Config wider = models::GPT2Config::tiny();
  wider.n_embd = 48;
  wider.n_layer = 3;
  const std::string error = test::error_message([&] {
    models::GPT2LMHead model(models::GPT2Options(wider).seed(1));
    auto optimizer = test::make_adamw(*model);
    load_dcp_hf(dcp(), *model, &optimizer, nullptr);
  });
  EXPECT_THAT(error, HasSubstr("/model' does not match the model"));
  EXPECT_THAT(error, HasSubstr("transformer.h.2.attn.c_attn.weight [144, 48]"));
  EXPECT_THAT(error, HasSubstr("transformer.wte.weight: checkpoint [256, 32], model [256, 48]"));
}

TEST_F(DcpHfCheckpoint, AnOptimizerWithAmsgradNeedsStateTheCheckpointLacks) {
  const std::string error = test::error_message([&] {
    auto model = make_dcp_model(nullptr);
    torch::optim::AdamW optimizer(unique_parameters(*model),
                                  torch::optim::AdamWOptions(kLr).amsgrad(true));
    load_dcp_hf(dcp(), *model, &optimizer, nullptr);
  });
  EXPECT_THAT(error, HasSubstr("/optim' does not match the optimizer"));
  EXPECT_THAT(error, HasSubstr("state.transformer.wte.weight.max_exp_avg_sq [256, 32]"));
}

}  // namespace
}  // namespace fsdp::checkpoint
