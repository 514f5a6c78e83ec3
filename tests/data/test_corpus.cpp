// Corpora from data specs (text, JSON lines, shards, globs) and the fsdp-tokenize program run
// as a real process: separators, errors naming file and line, flag validation.
#include <fsdp/data/corpus.h>
#include <fsdp/data/error.h>
#include <fsdp/data/token_shard.h>

#include "support/data_util.h"

#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include "support/command.h"

namespace fsdp::data {
namespace {

using test::error_of;
using test::TempDir;
using test::tiny;
using test::write_file;

TEST(TokenCorpus, TextAndJsonLinesWithSeparators) {
  TempDir dir;
  write_file(dir.file("a.txt"), " the");
  write_file(dir.file("b.jsonl"), "{\"text\": \"the\"}\n\n{\"body\": 1, \"text\": \" the\"}\n");
  Tokenizer t = tiny();
  CorpusOptions o;
  o.tokenizer = &t;
  TokenCorpus c = TokenCorpus::load(dir.file("a.txt") + "," + dir.file("b.jsonl"), o);
  EXPECT_EQ(c.tokens(), (std::vector<uint32_t>{259, 258, 259, 't', 257, 259, 258}));
  EXPECT_EQ(c.files().size(), 2u);
  c.check_window(6);
  const std::string e = error_of([&] { c.check_window(7); });
  EXPECT_NE(e.find("7 tokens, fewer than one window of seq_len + 1 = 8"), std::string::npos) << e;
  // BOS, when the config names one, starts each document instead.
  Tokenizer b = tiny(R"({"bos_token": {"content": "\u0120the"}, "eos_token": "<|endoftext|>"})");
  o.tokenizer = &b;
  EXPECT_EQ(TokenCorpus::load(dir.file("a.txt"), o).tokens(), (std::vector<uint32_t>{258, 258}));
}

TEST(TokenCorpus, GlobsShardsAndVocabCheck) {
  TempDir dir;
  write_shard(dir.file("s2.bin"), {3, 4}, ShardFormat::kUint16);
  write_shard(dir.file("s1.bin"), {1, 2}, ShardFormat::kUint32);
  CorpusOptions o;
  EXPECT_EQ(TokenCorpus::load(dir.path() + "/s*.bin", o).tokens(),
            (std::vector<uint32_t>{1, 2, 3, 4}));
  o.vocab_size = 4;
  const std::string e = error_of([&] { TokenCorpus::load(dir.path() + "/s*.bin", o); });
  EXPECT_NE(e.find("s2.bin: token 1 (byte offset 1026) is id 4"), std::string::npos) << e;
}

TEST(TokenCorpus, BadInputNamesFileAndLine) {
  TempDir dir;
  Tokenizer t = tiny();
  CorpusOptions o;
  o.tokenizer = &t;
  write_file(dir.file("bad.jsonl"), "{\"text\": \"a\"}\n{\"text\": \"b\"}\n{\"text\": oops}\n");
  std::string e = error_of([&] { TokenCorpus::load(dir.file("bad.jsonl"), o); });
  EXPECT_NE(e.find("bad.jsonl:3: malformed JSON"), std::string::npos) << e;
  write_file(dir.file("field.jsonl"), "{\"content\": \"a\"}\n");
  e = error_of([&] { TokenCorpus::load(dir.file("field.jsonl"), o); });
  EXPECT_NE(e.find("field.jsonl:1: no string field 'text'"), std::string::npos) << e;
  o.text_field = "content";
  EXPECT_EQ(TokenCorpus::load(dir.file("field.jsonl"), o).tokens().size(), 2u);
  e = error_of([&] { TokenCorpus::load(dir.path() + "/*.nothing", o); });
  EXPECT_NE(e.find("matches no file"), std::string::npos) << e;
  e = error_of([&] { TokenCorpus::load(dir.path(), o); });
  EXPECT_NE(e.find("directory"), std::string::npos) << e;
  e = error_of([&] { TokenCorpus::load(dir.file("missing.txt"), o); });
  EXPECT_NE(e.find("missing.txt"), std::string::npos) << e;
  write_file(dir.file("x.txt"), "x");
  CorpusOptions no_tok;
  e = error_of([&] { TokenCorpus::load(dir.file("x.txt"), no_tok); });
  EXPECT_NE(e.find("needs a tokenizer"), std::string::npos) << e;
  Tokenizer none = tiny("{}");
  o.tokenizer = &none;
  e = error_of([&] { TokenCorpus::load(dir.file("x.txt"), o); });
  EXPECT_NE(e.find("neither a BOS nor an EOS"), std::string::npos) << e;
}

// Runs fsdp-tokenize with args; returns (exit status, stderr).
std::pair<int, std::string> run_tokenize(const std::string& args) {
  const test::CommandResult r = test::run_command(std::string(FSDP_TOKENIZE_BIN) + " " + args, 120);
  return {r.exit_code, r.output};
}

TEST(FsdpTokenize, WritesTheShardTheLibraryGives) {
  TempDir dir;
  write_file(dir.file("tokenizer.json"), test::tiny_tokenizer().dump());
  write_file(dir.file("tokenizer_config.json"), R"({"eos_token": "<|endoftext|>"})");
  write_file(dir.file("a.txt"), "the other theme");
  write_file(dir.file("b.jsonl"), "{\"text\": \" then\"}\n{\"text\": \"\"}\n");
  auto [rc, err] =
      run_tokenize("--tokenizer " + dir.file("tokenizer.json") + " --output " +
                   dir.file("out.bin") + " " + dir.file("a.txt") + " '" + dir.path() + "/*.jsonl'");
  ASSERT_EQ(rc, 0) << err;
  EXPECT_NE(err.find("MB/s"), std::string::npos) << err;
  std::vector<uint32_t> shard;
  read_shard(dir.file("out.bin"), 260, shard);
  Tokenizer t = tiny();
  CorpusOptions o;
  o.tokenizer = &t;
  EXPECT_EQ(shard, TokenCorpus::load(dir.file("a.txt") + "," + dir.file("b.jsonl"), o).tokens());
}

// Fine-tuning inputs make a labeled shard, holding the corpus's tokens and labels.
TEST(FsdpTokenize, WritesALabeledShardForFineTuningData) {
  TempDir dir;
  write_file(dir.file("tokenizer.json"), test::tiny_tokenizer().dump());
  write_file(dir.file("tokenizer_config.json"), R"({"eos_token": "<|endoftext|>"})");
  write_file(dir.file("a.txt"), "the other theme");
  write_file(dir.file("b.jsonl"), "{\"prompt\": \"the\", \"completion\": \" then\"}\n");
  auto [rc, err] =
      run_tokenize("--tokenizer " + dir.file("tokenizer.json") + " --output " +
                   dir.file("out.bin") + " " + dir.file("a.txt") + " " + dir.file("b.jsonl"));
  ASSERT_EQ(rc, 0) << err;
  std::vector<uint32_t> shard;
  std::vector<int32_t> labels;
  read_shard(dir.file("out.bin"), 260, shard, &labels);
  Tokenizer t = tiny();
  CorpusOptions o;
  o.tokenizer = &t;
  const TokenCorpus c = TokenCorpus::load(dir.file("a.txt") + "," + dir.file("b.jsonl"), o);
  EXPECT_EQ(shard, c.tokens());
  EXPECT_EQ(labels, c.labels());
  // The prompt "the" is two tokens, the only ones that do not train.
  const std::string trained = std::to_string(c.tokens().size() - 2);
  EXPECT_NE(err.find("labeled: " + trained + " of them train"), std::string::npos) << err;
}

TEST(FsdpTokenize, ValidatesFlagsBeforeWork) {
  TempDir dir;
  write_file(dir.file("tokenizer.json"), test::tiny_tokenizer().dump());
  write_file(dir.file("a.txt"), "x");
  const std::string tok = " --tokenizer " + dir.file("tokenizer.json");
  const std::string out = " --output " + dir.file("o.bin");
  struct Case {
    std::string args, needle;
  };
  const Case cases[] = {
      {"--tokenizer " + dir.file("nope.json") + out + " " + dir.file("a.txt"), "--tokenizer"},
      {"--tokenizer " + dir.path() + out + " " + dir.file("a.txt"), "directory"},
      {tok + " --output " + dir.file("missing/o.bin") + " " + dir.file("a.txt"), "--output"},
      {tok + " --output " + dir.file("o.txt") + " " + dir.file("a.txt"), "must end in .bin"},
      {tok + out + " " + dir.file("nope.txt"), "input: data file"},
      {tok + out + " --tokenizer-config " + dir.file("nope.json") + " " + dir.file("a.txt"),
       "--tokenizer-config"},
      {tok + out + " --format uint8 " + dir.file("a.txt"), "--format"},
      {tok + out + " " + dir.file("a.txt"), "neither a BOS nor an EOS"},
  };
  for (const auto& c : cases) {
    auto [rc, err] = run_tokenize(c.args);
    EXPECT_NE(rc, 0) << c.args;
    EXPECT_NE(err.find(c.needle), std::string::npos) << c.args << " -> " << err;
  }
  EXPECT_NE(run_tokenize(tok + " " + dir.file("a.txt")).first, 0);  // no --output
}

}  // namespace
}  // namespace fsdp::data
