// load_token_dataset (fsdp/train/token_dataset.h): llm.c shards in the order of their sorted
// names, labeled shards as labeled data, a text file byte by byte without a tokenizer, ids
// checked against the vocabulary, and several text files without a tokenizer refused.
#include <fsdp/data/token_shard.h>
#include <fsdp/train/token_dataset.h>

#include "support/files.h"
#include "support/test_support.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace fsdp::train {
namespace {

std::string fresh_dir(const std::string& name) {
  const std::string dir = test::temp_path(name);
  test::remove_all(dir);
  EXPECT_TRUE(test::make_directories(dir));
  return dir;
}

std::vector<int32_t> ids_of(const TokenDataset& data) {
  const at::Tensor t = data.tokens().to(at::kInt).contiguous();
  return std::vector<int32_t>(t.data_ptr<int32_t>(), t.data_ptr<int32_t>() + t.numel());
}

TEST(TokenSources, ShardsLoadInNameOrderAsOneSequence) {
  const std::string dir = fresh_dir("sources_shards");
  data::write_shard(dir + "/b.bin", {4, 5, 6}, data::ShardFormat::kUint16);
  data::write_shard(dir + "/a.bin", {1, 2, 3}, data::ShardFormat::kUint32);
  TokenSourceOptions options;
  options.name = "--data";
  const TokenDataset data = load_token_dataset(dir + "/*.bin", options);
  EXPECT_EQ(ids_of(data), (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(data.tokens().scalar_type(), at::kInt);
  EXPECT_FALSE(data.labeled());
  EXPECT_EQ(data.source(), "--data '" + dir + "/*.bin'");
  EXPECT_TRUE(names_token_files_only(dir + "/*.bin"));

  const std::vector<int32_t> labels = {-100, 8, 9};
  data::write_shard(dir + "/labeled.bin", {7, 8, 9}, data::ShardFormat::kUint16, &labels);
  const TokenDataset labeled = load_token_dataset(dir + "/labeled.bin");
  ASSERT_TRUE(labeled.labeled());
  EXPECT_EQ(labeled.labels()[0].item<int32_t>(), -100);

  options.vocab_size = 5;
  const std::string msg = test::error_message([&] { load_token_dataset(dir + "/b.bin", options); });
  EXPECT_NE(msg.find("b.bin"), std::string::npos) << msg;
  EXPECT_NE(msg.find("5"), std::string::npos) << msg;
}

TEST(TokenSources, TextWithoutATokenizerIsItsBytes) {
  const std::string dir = fresh_dir("sources_text");
  ASSERT_TRUE(test::write_bytes(dir + "/a.txt", "hello"));
  ASSERT_TRUE(test::write_bytes(dir + "/b.txt", "world"));
  const TokenDataset text = load_token_dataset(dir + "/a.txt");
  EXPECT_EQ(text.tokens().scalar_type(), at::kByte);
  EXPECT_EQ(ids_of(text), (std::vector<int32_t>{'h', 'e', 'l', 'l', 'o'}));
  EXPECT_FALSE(names_token_files_only(dir + "/a.txt"));
  const std::string msg = test::error_message([&] { load_token_dataset(dir + "/*.txt"); });
  EXPECT_NE(msg.find("names 2 files"), std::string::npos) << msg;
}

}  // namespace
}  // namespace fsdp::train
