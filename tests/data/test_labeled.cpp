// Fine-tuning data in process: prompt/completion and input_ids/labels JSON lines become tokens
// and labels (only the completion and its EOS train), a corpus mixing them with text labels the
// text's tokens as themselves, labeled shards round-trip and stay distinct from llm.c's, and
// every malformed record is refused naming the file, the line and the key or value.
#include <fsdp/data/corpus.h>
#include <fsdp/data/error.h>
#include <fsdp/data/labeled.h>
#include <fsdp/data/token_shard.h>

#include "support/data_util.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>

namespace fsdp::data {
namespace {

using test::error_of;
using test::TempDir;
using test::tiny;
using test::write_file;

constexpr int32_t M = kIgnoreIndex;
// The tiny tokenizer's ids: "the" is 't' (116) + "he" (257), " the" is 258, EOS 259.
constexpr uint32_t kT = 't', kHe = 257, kSpaceThe = 258, kEos = 259;

TEST(FineTuneData, PromptCompletionTrainsTheCompletionAndEos) {
  TempDir dir;
  write_file(dir.file("pc.jsonl"),
             "{\"prompt\": \"the\", \"completion\": \" the\", \"id\": 7}\n\n"
             "{\"completion\": \"the\", \"prompt\": \"\"}\n");
  Tokenizer t = tiny();
  CorpusOptions o;
  o.tokenizer = &t;
  const TokenCorpus c = TokenCorpus::load(dir.file("pc.jsonl"), o);
  // No separator: each example is prompt + completion + EOS, back to back.
  EXPECT_EQ(c.tokens(), (std::vector<uint32_t>{kT, kHe, kSpaceThe, kEos, kT, kHe, kEos}));
  EXPECT_EQ(c.labels(), (std::vector<int32_t>{M, M, int32_t(kSpaceThe), kEos, kT, kHe, kEos}));
  EXPECT_TRUE(c.labeled());
  EXPECT_EQ(jsonl_form_of(dir.file("pc.jsonl")), JsonlForm::kPromptCompletion);
}

TEST(FineTuneData, TokenIdsAreTakenAsTheyAreWithoutATokenizer) {
  TempDir dir;
  write_file(dir.file("ids.jsonl"),
             "{\"input_ids\": [1, 2, 3], \"labels\": [-100, 2, 3]}\n"
             "{\"labels\": [-100, -100, 9, 4], \"input_ids\": [5, 6, 7, 8]}\n");
  CorpusOptions o;  // no tokenizer, no vocabulary
  const TokenCorpus c = TokenCorpus::load(dir.file("ids.jsonl"), o);
  EXPECT_EQ(c.tokens(), (std::vector<uint32_t>{1, 2, 3, 5, 6, 7, 8}));
  // Labels need not equal the ids: they are what the position before predicts.
  EXPECT_EQ(c.labels(), (std::vector<int32_t>{M, 2, 3, M, M, 9, 4}));
  EXPECT_EQ(jsonl_form_of(dir.file("ids.jsonl")), JsonlForm::kTokenIds);
}

TEST(FineTuneData, TextAndPlainShardsInALabeledCorpusTrainAsThemselves) {
  TempDir dir;
  write_file(dir.file("a.txt"), " the");
  write_shard(dir.file("b.bin"), {4, 5}, ShardFormat::kUint16);
  write_file(dir.file("c.jsonl"), "{\"input_ids\": [1, 2], \"labels\": [-100, 2]}\n");
  write_file(dir.file("d.jsonl"), "{\"text\": \"the\"}\n");
  Tokenizer t = tiny();
  CorpusOptions o;
  o.tokenizer = &t;
  const TokenCorpus c = TokenCorpus::load(dir.file("a.txt") + "," + dir.file("b.bin") + "," +
                                              dir.file("c.jsonl") + "," + dir.file("d.jsonl"),
                                          o);
  EXPECT_EQ(c.tokens(), (std::vector<uint32_t>{kEos, kSpaceThe, 4, 5, 1, 2, kEos, kT, kHe}));
  EXPECT_EQ(c.labels(), (std::vector<int32_t>{kEos, kSpaceThe, 4, 5, M, 2, kEos, kT, kHe}));
  // Without a fine-tuning file, a corpus holds no labels, as before.
  EXPECT_FALSE(TokenCorpus::load(dir.file("a.txt") + "," + dir.file("d.jsonl"), o).labeled());
  // A reader that takes tokens only refuses labels rather than dropping them.
  std::vector<uint32_t> tokens;
  const std::string e = error_of([&] { load_data_file(dir.file("c.jsonl"), o, tokens); });
  EXPECT_NE(e.find("c.jsonl' carries labels"), std::string::npos) << e;
  EXPECT_TRUE(tokens.empty());
}

TEST(FineTuneData, LabeledShardsRoundTripUnderTheirOwnVersions) {
  TempDir dir;
  const std::vector<uint32_t> ids = {1, 2, 3};
  const std::vector<int32_t> labels = {M, 2, 3};
  for (const ShardFormat format : {ShardFormat::kUint16, ShardFormat::kUint32}) {
    const std::vector<uint8_t> bytes = encode_shard(ids, format, &labels);
    int32_t header[3];
    std::memcpy(header, bytes.data(), sizeof(header));
    const bool narrow = format == ShardFormat::kUint16;
    EXPECT_EQ(header[0], narrow ? kShardMagicUint16 : kShardMagicUint32);
    EXPECT_EQ(header[1], narrow ? kShardVersionUint16Labeled : kShardVersionUint32Labeled);
    EXPECT_EQ(bytes.size(), kShardHeaderBytes + 3 * (narrow ? 2 : 4) + 3 * 4);
    std::vector<uint32_t> got_ids;
    std::vector<int32_t> got_labels;
    decode_shard(bytes.data(), bytes.size(), "s.bin", 4, got_ids, &got_labels);
    EXPECT_EQ(got_ids, ids);
    EXPECT_EQ(got_labels, labels);
    // A reader of tokens only refuses it; a truncated one is named.
    got_ids.clear();
    std::string e =
        error_of([&] { decode_shard(bytes.data(), bytes.size(), "s.bin", 4, got_ids); });
    EXPECT_NE(e.find("s.bin: a labeled shard"), std::string::npos) << e;
    e = error_of(
        [&] { decode_shard(bytes.data(), bytes.size() - 1, "s.bin", 4, got_ids, &got_labels); });
    EXPECT_NE(e.find("and their 4-byte labels"), std::string::npos) << e;
    EXPECT_NE(e.find("(truncated)"), std::string::npos) << e;
  }
  // A plain shard decodes as before and adds no labels.
  const std::vector<uint8_t> plain = encode_shard(ids, ShardFormat::kUint16);
  std::vector<uint32_t> got_ids;
  std::vector<int32_t> got_labels;
  decode_shard(plain.data(), plain.size(), "p.bin", 4, got_ids, &got_labels);
  EXPECT_EQ(got_ids, ids);
  EXPECT_TRUE(got_labels.empty());
  // Labels outside the vocabulary, and counts that differ, are refused.
  const std::vector<int32_t> bad = {M, 7, -3};
  const std::vector<uint8_t> bytes = encode_shard(ids, ShardFormat::kUint16, &bad);
  std::string e =
      error_of([&] { decode_shard(bytes.data(), bytes.size(), "b.bin", 4, got_ids, &got_labels); });
  EXPECT_NE(e.find("b.bin: label 1 (byte offset 1034) is 7, neither -100 (masked) nor an id"),
            std::string::npos)
      << e;
  const std::vector<int32_t> short_labels = {M};
  e = error_of([&] { encode_shard(ids, ShardFormat::kUint16, &short_labels); });
  EXPECT_NE(e.find("3 tokens, 1 labels"), std::string::npos) << e;
  // A labeled shard in a corpus keeps its labels.
  write_shard(dir.file("l.bin"), ids, ShardFormat::kUint16, &labels);
  const TokenCorpus c = TokenCorpus::load(dir.file("l.bin"), CorpusOptions{});
  EXPECT_EQ(c.labels(), labels);
}

// Each bad file, and the words its error must hold (the file, line, key or value).
struct BadFile {
  std::string text, needle;
};

TEST(FineTuneData, MalformedRecordsAreNamedByFileLineAndKey) {
  TempDir dir;
  Tokenizer t = tiny();
  CorpusOptions o;
  o.tokenizer = &t;
  const std::string pc = "{\"prompt\": \"a\", \"completion\": \"b\"}\n";
  const std::string ids = "{\"input_ids\": [1, 2], \"labels\": [-100, 2]}\n";
  const BadFile cases[] = {
      {pc + "{\"prompt\": \"a\", \"completion\": b}\n", "f.jsonl:2: malformed JSON"},
      {pc + "{\"prompt\": \"a\"}\n", "f.jsonl:2: no field 'completion'"},
      {pc + "{\"text\": \"a\"}\n", "f.jsonl:2: no field 'prompt'"},
      {pc + "{\"prompt\": 3, \"completion\": \"b\"}\n",
       "f.jsonl:2: 'prompt' must be a string, not number 3"},
      {pc + "\n" + ids,
       "f.jsonl:3: a record of the input_ids/labels form in a file of the prompt/completion"},
      {"{\"text\": \"a\"}\n" + pc,
       "f.jsonl:2: a record of the prompt/completion form in a file of the text form"},
      {"{\"prompt\": \"a\", \"labels\": [1]}\n", "f.jsonl:1: a record has either"},
      {"{\"input_ids\": [1, 2, 3], \"labels\": [-100, 2]}\n",
       "f.jsonl:1: input_ids has 3 elements but labels has 2"},
      {ids + "{\"input_ids\": [1, 2], \"labels\": [-100, -100]}\n",
       "f.jsonl:2: every label is -100, so nothing in this example trains"},
      {"{\"input_ids\": [1, 260], \"labels\": [-100, 2]}\n",
       "f.jsonl:1: input_ids[1] is 260, outside the vocabulary [0, 260)"},
      {"{\"input_ids\": [1, 2], \"labels\": [-100, -5]}\n",
       "f.jsonl:1: labels[1] is -5, neither -100 (masked) nor an id in [0, 260)"},
      {"{\"input_ids\": [1, 2.5], \"labels\": [-100, 2]}\n",
       "f.jsonl:1: input_ids[1] is 2.5, not an integer"},
      {"{\"input_ids\": \"1 2\", \"labels\": [-100, 2]}\n",
       "f.jsonl:1: 'input_ids' must be an array of integers, not string"},
      {"{\"input_ids\": [1, 2]}\n", "f.jsonl:1: no field 'labels'"},
      {"{\"input_ids\": [], \"labels\": []}\n", "f.jsonl:1: input_ids and labels are empty"},
  };
  for (const BadFile& c : cases) {
    write_file(dir.file("f.jsonl"), c.text);
    const std::string e = error_of([&] { TokenCorpus::load(dir.file("f.jsonl"), o); });
    EXPECT_NE(e.find(c.needle), std::string::npos) << c.text << " -> " << e;
  }
  // prompt/completion needs a tokenizer, and one that names EOS.
  write_file(dir.file("f.jsonl"), pc);
  std::string e = error_of([&] { TokenCorpus::load(dir.file("f.jsonl"), CorpusOptions{}); });
  EXPECT_NE(e.find("is prompt/completion JSON lines, which needs a tokenizer"), std::string::npos)
      << e;
  Tokenizer none = tiny("{}");
  o.tokenizer = &none;
  e = error_of([&] { TokenCorpus::load(dir.file("f.jsonl"), o); });
  EXPECT_NE(e.find("ends each example with EOS, but the tokenizer names none"), std::string::npos)
      << e;
}

}  // namespace
}  // namespace fsdp::data
