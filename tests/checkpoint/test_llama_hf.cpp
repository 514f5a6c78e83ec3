// Llama and Hugging Face: transformers' LlamaForCausalLM loads our exports (untied from
// fsdp-train; tied, split into 3 files with an index, from save_full) with no missing or
// unexpected keys and the same logits, and
// we load checkpoints transformers saved in several shards (model.safetensors.index.json) and
// match its logits; fsdp-train --init-from reads such a sharded checkpoint over 3 ranks, each
// reading its rows, and exports exactly the tensors transformers wrote. The configuration
// covers grouped-query attention (4 heads, 2 kv heads) and Llama 3.1 rope scaling.
#include <fsdp/checkpoint/checkpoint.h>
#include <fsdp/checkpoint/safetensors.h>
#include <models/llama/hf.h>
#include <models/llama/llama.h>

#include "support/checkpoint_util.h"
#include "support/test_support.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>

#ifndef FSDP_SOURCE_DIR
#error "FSDP_SOURCE_DIR must name the source tree (tests/CMakeLists.txt defines it)"
#endif

namespace fsdp::checkpoint {
namespace {

using models::LlamaConfig;
using models::LlamaForCausalLM;
using models::LlamaOptions;
using test::CommandResult;
using test::exists;
using test::fsdp_train_binary;
using test::list_dir;
using test::run_command;
using test::temp_dir;
using ::testing::HasSubstr;

LlamaConfig tied_tiny() {
  LlamaConfig c = LlamaConfig::tiny();
  c.tie_word_embeddings = true;
  return c;
}

at::Tensor llama_logits_of(const LlamaConfig& config, const std::string& path,
                           const at::Tensor& input_ids) {
  LlamaForCausalLM model(LlamaOptions(config).seed(99));
  load_full(path, *model, nullptr, models::llama_hf_layout(config));
  at::NoGradGuard no_grad;
  return model->forward(input_ids);
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

// Every tensor of a sharded checkpoint directory.
std::map<std::string, at::Tensor> sharded_tensors(const std::string& dir) {
  std::map<std::string, at::Tensor> all;
  for (const auto& name : list_dir(dir)) {
    if (name.rfind("model-", 0) != 0) continue;
    for (auto& [key, t] : load_safetensors(dir + "/" + name)) all[key] = t;
  }
  return all;
}

TEST(LlamaHuggingFace, TransformersLoadsOurExportsAndWeLoadTheirShardedCheckpoints) {
  for (const char* package : {"transformers", "safetensors", "torch"}) {
    ASSERT_NE(test::installed_version(test::reference_python(), package), "")
        << "the Hugging Face interop test needs " << package << " in " << test::reference_python()
        << " (set FSDP_PYTHON or -DFSDP_PYTHON to another interpreter)";
  }

  const std::string dir = temp_dir("llama_hf");
  const std::string ours = dir + "/ours", ours_tied = dir + "/ours_tied";
  const std::string theirs = dir + "/theirs", theirs_tied = dir + "/theirs_tied";
  const CommandResult trained =
      run_command(fsdp_train_binary() +
                  " --model llama-tiny --nproc 2 --steps 3 --global-batch 4 --seq-len 16 --quiet "
                  "--export " +
                  ours + "/model.safetensors");
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  ASSERT_TRUE(exists(ours + "/config.json"));
  {
    LlamaForCausalLM tied(LlamaOptions(tied_tiny()).seed(5));
    ::mkdir(ours_tied.c_str(), 0755);
    // Sharded as save_pretrained(max_shard_size="40KB") would: 107 kB of tensors in 3 files.
    save_full(ours_tied + "/model.safetensors", *tied, nullptr,
              ExportOptions().layout(models::llama_hf_layout(tied_tiny())).max_shard_bytes(40000));
    write_text(ours_tied + "/config.json", models::llama_hf_config_json(tied_tiny()));
    EXPECT_FALSE(exists(ours_tied + "/model.safetensors"));
    ASSERT_TRUE(exists(ours_tied + "/model.safetensors.index.json"));
    size_t stored = 0, files = 0;
    for (const auto& name : list_dir(ours_tied)) {
      if (name.rfind("model-", 0) != 0) continue;
      EXPECT_THAT(name, ::testing::EndsWith("-of-00003.safetensors"));
      stored += SafetensorsReader(ours_tied + "/" + name).header().entries.size();
      ++files;
    }
    EXPECT_EQ(files, 3u);
    EXPECT_EQ(stored, tied->named_parameters().size() - 1) << "a tied lm_head is stored once";
  }
  const at::Tensor input_ids = (at::arange(2 * 24).reshape({2, 24}) * 37 + 11).remainder(256);
  for (const auto& [path, config] :
       {std::pair{ours, LlamaConfig::tiny()}, std::pair{ours_tied, tied_tiny()}}) {
    save_safetensors(path + "/expected.safetensors",
                     {{"input_ids", input_ids},
                      {"logits", llama_logits_of(config, path, input_ids)}});  // the directory
  }

  // transformers' side, cached by our files' bytes (support/reference_cache.h).
  const test::ReferenceResult checked = test::run_reference(
      test::reference_python(), {FSDP_SOURCE_DIR "/tests/checkpoint/llama_interop.py",
                                 ours + " " + ours_tied + " " + theirs + " " + theirs_tied,
                                 {ours, ours_tied},
                                 {theirs, theirs_tied}});
  ASSERT_EQ(checked.exit_code, 0) << checked.output;
  std::cout << checked.output;
  EXPECT_THAT(checked.output, HasSubstr("ours loads with no missing or unexpected keys"));
  EXPECT_THAT(checked.output, HasSubstr("ours_tied loads with no missing or unexpected keys"));

  for (const auto& [path, config] :
       {std::pair{theirs, LlamaConfig::tiny()}, std::pair{theirs_tied, tied_tiny()}}) {
    SCOPED_TRACE(path);
    ASSERT_TRUE(exists(path + "/model.safetensors.index.json"));
    const auto expected = load_safetensors(path + "/expected.safetensors");
    const at::Tensor got =
        llama_logits_of(config, path, expected.at("input_ids"));  // the directory
    const double diff = (got - expected.at("logits")).abs().max().item<double>();
    std::cout << path << ": max |logits difference| = " << diff << "\n";
    EXPECT_LE(diff, 1e-5) << "logits of the transformers-written checkpoint, computed by our model";
  }

  // fsdp-train over 3 ranks initializes from the sharded checkpoint (through its index file)
  // and exports it again: exactly transformers' tensors.
  const std::string again = dir + "/again/model.safetensors";
  const CommandResult reloaded =
      run_command(fsdp_train_binary() +
                  " --model llama-tiny --nproc 3 --steps 0 --global-batch 3 "
                  "--seq-len 16 --quiet --init-from " +
                  theirs + "/model.safetensors.index.json --export " + again);
  ASSERT_EQ(reloaded.exit_code, 0) << reloaded.output;
  const auto want = sharded_tensors(theirs);
  const auto got = load_safetensors(again);
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [key, t] : want) {
    ASSERT_TRUE(got.count(key)) << key;
    EXPECT_TRUE(at::equal(got.at(key), t)) << key;
  }
}

TEST(LlamaHuggingFace, AnIndexThatDisagreesWithItsFilesIsAnError) {
  const std::string dir = temp_dir("llama_index");
  LlamaForCausalLM model(LlamaOptions(LlamaConfig::tiny()).seed(3));
  std::vector<std::pair<std::string, at::Tensor>> first, second;
  std::string weight_map;
  int i = 0;
  for (const auto& item : model->named_parameters()) {
    const bool in_first = i++ % 2 == 0;
    (in_first ? first : second).emplace_back(item.key(), item.value().detach());
    weight_map += std::string(weight_map.empty() ? "" : ", ") + "\"" + item.key() + "\": \"" +
                  (in_first ? "a.safetensors" : "b.safetensors") + "\"";
  }
  save_safetensors(dir + "/a.safetensors", first);
  save_safetensors(dir + "/b.safetensors", second);
  write_text(dir + "/model.safetensors.index.json",
             "{\"metadata\": {}, \"weight_map\": {" + weight_map + "}}");
  LlamaForCausalLM loaded(LlamaOptions(LlamaConfig::tiny()).seed(4));
  load_full(dir, *loaded, nullptr, models::llama_hf_layout(LlamaConfig::tiny()));
  for (const auto& item : loaded->named_parameters())
    EXPECT_TRUE(at::equal(item.value(), model->named_parameters()[item.key()])) << item.key();

  // The index places embed_tokens (in a.safetensors) in b.safetensors.
  std::string wrong = weight_map;
  const std::string entry = "\"model.embed_tokens.weight\": \"a.safetensors\"";
  wrong.replace(wrong.find(entry), entry.size(),
                "\"model.embed_tokens.weight\": \"b.safetensors\"");
  write_text(dir + "/model.safetensors.index.json",
             "{\"metadata\": {}, \"weight_map\": {" + wrong + "}}");
  try {
    load_full(dir, *loaded, nullptr, models::llama_hf_layout(LlamaConfig::tiny()));
    FAIL() << "expected an error";
  } catch (const c10::Error& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("model.embed_tokens.weight")) << e.what();
    EXPECT_THAT(std::string(e.what()), HasSubstr("b.safetensors")) << e.what();
  }
  EXPECT_THROW(load_full(dir + "/none", *loaded, nullptr), c10::Error);
}

// Exports of different models into one directory, sharded and not, alternating: a directory
// load always finds the newest, and the sharded export is the same tensors as the single file.
TEST(LlamaHuggingFace, ShardedAndSingleExportsReplaceEachOther) {
  const std::string dir = temp_dir("llama_reexport");
  const auto layout = models::llama_hf_layout(LlamaConfig::tiny());
  auto expect_loads_as = [&](const LlamaForCausalLM& want) {
    LlamaForCausalLM loaded(LlamaOptions(LlamaConfig::tiny()).seed(100));
    load_full(dir, *loaded, nullptr, layout);
    for (const auto& item : loaded->named_parameters())
      EXPECT_TRUE(at::equal(item.value(), want->named_parameters()[item.key()])) << item.key();
  };
  LlamaForCausalLM a(LlamaOptions(LlamaConfig::tiny()).seed(1));
  LlamaForCausalLM b(LlamaOptions(LlamaConfig::tiny()).seed(2));
  save_full(dir + "/model.safetensors", *a, nullptr, ExportOptions().layout(layout));
  save_full(dir + "/model.safetensors", *b, nullptr,
            ExportOptions().layout(layout).max_shard_bytes(50000));
  EXPECT_FALSE(exists(dir + "/model.safetensors"));
  ASSERT_TRUE(exists(dir + "/model.safetensors.index.json"));
  expect_loads_as(b);
  save_full(dir + "/model.safetensors", *a, nullptr, ExportOptions().layout(layout));
  EXPECT_FALSE(exists(dir + "/model.safetensors.index.json"));
  expect_loads_as(a);
  // A limit above the model's size writes one file.
  save_full(dir + "/model.safetensors", *b, nullptr,
            ExportOptions().layout(layout).max_shard_bytes(1 << 30));
  EXPECT_FALSE(exists(dir + "/model.safetensors.index.json"));
  expect_loads_as(b);
}

}  // namespace
}  // namespace fsdp::checkpoint
