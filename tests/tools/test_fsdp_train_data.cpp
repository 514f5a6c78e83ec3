// fsdp-train on real data, as real processes: a tokenizer.json with JSON-lines documents gives
// the model the tokenizer's vocabulary and a sharded run reproduces the --no-fsdp reference;
// llm.c .bin shards train without a tokenizer, and an id beyond the model's vocabulary is
// refused naming the shard.
#include "support/files.h"
#include "support/test_support.h"

#include <fsdp/data/token_shard.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace fsdp::train {
namespace {

using test::CommandResult;
using test::read_json_lines;
using test::run_command;
using test::run_fsdp_train;
using ::testing::HasSubstr;

std::string data_temp_path(const std::string& name) {
  return test::temp_path("fsdp_train_data_" + name);
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

// GPT-2's byte -> char table entry of byte b, as UTF-8.
std::string byte_char(int b) {
  int n = 0, cp = -1;
  for (int x = 0; x < 256; ++x) {
    const bool printable = (x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174;
    const int c = printable ? x : 256 + n++;
    if (x == b) cp = c;
  }
  std::string s;
  if (cp < 0x80) {
    s.push_back(static_cast<char>(cp));
  } else {
    s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return s;
}

// A byte-level BPE tokenizer: 256 byte tokens, merges "Ġ t", "h e", "Ġt he", and
// <|endoftext|> = 259, so 260 ids.
std::string tiny_tokenizer_json() {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  const std::string sp = byte_char(' ');
  vocab[sp + "t"] = 256;
  vocab["he"] = 257;
  vocab[sp + "the"] = 258;
  nlohmann::json model = {{"type", "BPE"},
                          {"dropout", nullptr},
                          {"unk_token", nullptr},
                          {"continuing_subword_prefix", nullptr},
                          {"end_of_word_suffix", nullptr},
                          {"fuse_unk", false},
                          {"byte_fallback", false},
                          {"ignore_merges", false},
                          {"vocab", vocab}};
  model["merges"] = nlohmann::json::array({sp + " t", "h e", sp + "t he"});
  nlohmann::json added = nlohmann::json::array();
  added.push_back({{"id", 259},
                   {"content", "<|endoftext|>"},
                   {"single_word", false},
                   {"lstrip", false},
                   {"rstrip", false},
                   {"normalized", false},
                   {"special", true}});
  const nlohmann::json byte_level = {{"type", "ByteLevel"},
                                     {"add_prefix_space", false},
                                     {"trim_offsets", true},
                                     {"use_regex", true}};
  return nlohmann::json{
      {"version", "1.0"},          {"truncation", nullptr}, {"padding", nullptr},
      {"added_tokens", added},     {"normalizer", nullptr}, {"pre_tokenizer", byte_level},
      {"post_processor", nullptr}, {"decoder", byte_level}, {"model", model}}
      .dump();
}

TEST(FsdpTrainData, TokenizedJsonLinesMatchTheReference) {
  const std::string dir = data_temp_path("tok");
  ASSERT_TRUE(test::make_directories(dir)) << dir;
  write_file(dir + "/tokenizer.json", tiny_tokenizer_json());
  write_file(dir + "/tokenizer_config.json", R"({"eos_token": "<|endoftext|>"})");
  std::string docs, val;
  for (int i = 0; i < 40; ++i) {
    docs +=
        nlohmann::json{{"body", "the cat " + std::to_string(i) + " sat on the mat."}}.dump() + "\n";
  }
  for (int i = 0; i < 8; ++i)
    val += nlohmann::json{{"body", "the dog sat on the cat."}}.dump() + "\n";
  write_file(dir + "/train.jsonl", docs);
  write_file(dir + "/val.jsonl", val);
  const std::string common =
      "--model tiny --steps 3 --global-batch 4 --seq-len 16 --seed 2 "
      "--tokenizer " +
      dir + "/tokenizer.json --text-field body --data " + dir + "/train.jsonl --val-data " + dir +
      "/val.jsonl";
  const CommandResult a = run_fsdp_train("--nproc 2 " + common + " --metrics " + dir + "/w2.jsonl");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_THAT(a.output, HasSubstr("val loss"));
  const CommandResult b =
      run_fsdp_train("--no-fsdp --quiet " + common + " --metrics " + dir + "/w1.jsonl");
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const auto got = read_json_lines(dir + "/w2.jsonl");
  const auto want = read_json_lines(dir + "/w1.jsonl");
  ASSERT_EQ(got.size(), 3u);
  ASSERT_EQ(want.size(), 3u);
  // 260 ids: the tokenizer's vocabulary is the model's, and the first loss is a uniform guess.
  EXPECT_NEAR(want[0]["loss"].get<double>(), std::log(260.0), 0.3);
  for (size_t s = 0; s < 3; ++s) {
    const double loss = got[s]["loss"], ref = want[s]["loss"];
    EXPECT_NEAR(loss, ref, 1e-5 * ref) << "step " << s + 1;
  }
  const double val_loss = got[2]["val_loss"], ref_val = want[2]["val_loss"];
  EXPECT_NEAR(val_loss, ref_val, 1e-5 * ref_val);

  // A different --text-field is different data: a resume would not continue the run. And a
  // field the documents lack is named.
  const CommandResult missing =
      run_fsdp_train("--no-fsdp --quiet " + common + " --text-field text");
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_THAT(missing.output, HasSubstr("text"));
}

TEST(FsdpTrainData, ShardsTrainWithoutATokenizerAndOutOfVocabularyIdsAreNamed) {
  const std::string dir = data_temp_path("shards");
  ASSERT_TRUE(test::make_directories(dir)) << dir;
  std::vector<uint32_t> a, b;
  for (uint32_t i = 0; i < 400; ++i) a.push_back((i * 7) % 50);
  for (uint32_t i = 0; i < 400; ++i) b.push_back((i * 11) % 50 + 100);
  data::write_shard(dir + "/part_000.bin", a, data::ShardFormat::kUint16);
  data::write_shard(dir + "/part_001.bin", b, data::ShardFormat::kUint16);
  const std::string common = "--model tiny --steps 2 --global-batch 4 --seq-len 16 --quiet";
  const std::string metrics = dir + "/m.jsonl";
  const CommandResult ok = run_fsdp_train("--nproc 2 " + common + " --data '" + dir +
                                          "/part_*.bin' --metrics " + metrics);
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_EQ(read_json_lines(metrics).size(), 2u);

  std::vector<uint32_t> bad(100, 3);
  bad[42] = 300;  // tiny's vocabulary is 256
  data::write_shard(dir + "/bad.bin", bad, data::ShardFormat::kUint16);
  const CommandResult refused =
      run_fsdp_train("--no-fsdp " + common + " --data " + dir + "/bad.bin");
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_THAT(refused.output, HasSubstr("bad.bin"));
  EXPECT_THAT(refused.output, HasSubstr("300"));
}

// The real-text demo of docs/data.md at small scale: a tokenizer trained on fortunes,
// llama-debug on 2 ranks with held-out loss, the export loaded by transformers, which generates
// from it.
TEST(FortunesDemo, RunsEndToEndAtSmallScale) {
  const std::string out = data_temp_path("demo");
  const CommandResult r =
      run_command("env FSDP_PYTHON=" + test::reference_python() +
                      " bash " FSDP_SOURCE_DIR "/scripts/demo_fortunes.sh " + out + " 4",
                  600);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("val loss at step 4"));
  EXPECT_THAT(r.output, HasSubstr("unigram cross-entropy of the held-out text"));
  std::ifstream generated(out + "/generate.txt");
  int lines = 0;
  for (std::string line; std::getline(generated, line);) lines += line.size() > 2 ? 1 : 0;
  EXPECT_EQ(lines, 3) << "transformers should have generated one continuation per prompt";
}

}  // namespace
}  // namespace fsdp::train
