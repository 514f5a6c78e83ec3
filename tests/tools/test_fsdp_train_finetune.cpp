// fsdp-train on fine-tuning data, as real processes:
// - prompt/completion JSON lines against transformers (tests/tools/finetune_reference.py,
//   cached): a random GPT-2 saved by transformers, trained one step with --init-from, gives
//   transformers' model(input_ids, labels=labels).loss on the very batch we trained (dumped by
//   --dump-batches), 1e-5 relative, and that loss is not the unmasked one;
// - two ranks with two accumulated slices each equal one process (losses, gradient norms,
//   held-out loss, 1e-5), and tokens_per_s counts the trained targets of the dumped batches;
// - fsdp-tokenize's labeled shard trains bit for bit as the JSON lines it came from, without a
//   tokenizer;
// - a malformed file is refused before training, naming the file, the line and the key.
#include "support/data_util.h"
#include "support/files.h"
#include "support/test_support.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#ifndef FSDP_SOURCE_DIR
#error "FSDP_SOURCE_DIR must name the source tree (tests/CMakeLists.txt defines it)"
#endif

namespace fsdp::test {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Arithmetic questions and answers: the prompts are several times longer than the completions,
// so a loss over every token would differ plainly from the loss over the completions.
std::string examples(int n, int offset) {
  std::string text;
  for (int i = offset; i < offset + n; ++i) {
    const int a = i % 7 + 1, b = i % 5 + 2;
    text += nlohmann::json{{"prompt", "Question: what is " + std::to_string(a) + " times " +
                                          std::to_string(b) + "? Answer:"},
                           {"completion", " " + std::to_string(a * b)}}
                .dump() +
            "\n";
  }
  return text;
}

// The step losses and gradient norms of a --metrics file.
void expect_same_steps(const std::string& got_path, const std::string& want_path, size_t steps) {
  const auto got = read_json_lines(got_path), want = read_json_lines(want_path);
  ASSERT_EQ(got.size(), steps);
  ASSERT_EQ(want.size(), steps);
  for (size_t s = 0; s < steps; ++s) {
    for (const char* key : {"loss", "grad_norm"}) {
      const double g = got[s][key], w = want[s][key];
      EXPECT_NEAR(g, w, 1e-5 * std::abs(w)) << key << " at step " << s + 1;
    }
  }
}

// The count of trained targets (not -100) of each step in a --dump-batches file.
std::vector<int64_t> trained_per_step(const std::string& path) {
  const std::string bytes = read_bytes(path);
  std::vector<int64_t> v((bytes.size() - 8) / 8);
  std::memcpy(v.data(), bytes.data() + 8, v.size() * 8);
  const int64_t b = v[0], t = v[1], k = v[2], record = 2 + 2 * b * t;
  std::vector<int64_t> trained;
  for (size_t at = 3; at + record <= v.size(); at += record) {
    if (v[at + 1] == 0) trained.push_back(0);
    for (int64_t i = 0; i < b * t; ++i) trained.back() += v[at + 2 + b * t + i] != -100 ? 1 : 0;
  }
  EXPECT_EQ(k, 1);
  return trained;
}

class FsdpTrainFinetune : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = temp_path("finetune");
    ASSERT_TRUE(make_directories(root_ + "/tok"));
    ASSERT_TRUE(write_bytes(root_ + "/tok/tokenizer.json", tiny_tokenizer().dump()));
    ASSERT_TRUE(
        write_bytes(root_ + "/tok/tokenizer_config.json", R"({"eos_token": "<|endoftext|>"})"));
    ASSERT_TRUE(write_bytes(root_ + "/train.jsonl", examples(40, 0)));
    ASSERT_TRUE(write_bytes(root_ + "/val.jsonl", examples(12, 100)));
  }
  static void TearDownTestSuite() { remove_all(root_); }

  static std::string tokenizer() { return root_ + "/tok/tokenizer.json"; }

  static inline std::string root_;
};

TEST_F(FsdpTrainFinetune, StepOneLossEqualsTransformers) {
  const std::string script = FSDP_SOURCE_DIR "/tests/tools/finetune_reference.py";
  const std::string model = root_ + "/model";
  const ReferenceResult made =
      run_reference(reference_python(), {script, "make " + model, {}, {model}, false, 300});
  ASSERT_EQ(made.exit_code, 0) << made.output;
  const std::string metrics = root_ + "/hf_step.jsonl", batches = root_ + "/hf_batches.bin";
  const CommandResult r = run_fsdp_train(
      "--no-fsdp --quiet --init-from " + model + " --tokenizer " + tokenizer() + " --data " +
      root_ + "/train.jsonl --steps 1 --global-batch 4 --seq-len 32 --seed 5 --metrics " + metrics +
      " --dump-batches " + batches);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string out = root_ + "/hf_loss.json";
  const ReferenceResult ref = run_reference(
      reference_python(),
      {script, "loss " + model + " " + batches + " " + out, {model, batches}, {out}, false, 300});
  ASSERT_EQ(ref.exit_code, 0) << ref.output;
  std::cout << ref.output << (ref.from_cache ? "(from the reference cache)\n" : "");
  const nlohmann::json want = nlohmann::json::parse(read_bytes(out));
  const double loss = read_json_lines(metrics).at(0)["loss"], hf = want["loss"];
  EXPECT_NEAR(loss, hf, 1e-5 * hf);
  // The batch has masked targets, and masking them moves the loss by 100 times the tolerance.
  EXPECT_LT(want["trained"].get<int64_t>(), want["targets"].get<int64_t>());
  EXPECT_GT(want["trained"].get<int64_t>(), 0);
  EXPECT_GT(std::abs(want["unmasked_loss"].get<double>() - hf), 1e-3 * hf);
}

TEST_F(FsdpTrainFinetune, TwoRanksEqualOneAndTokensPerSecondCountsTrainedTargets) {
  const std::string common = "--model tiny --tokenizer " + tokenizer() + " --data " + root_ +
                             "/train.jsonl --val-data " + root_ +
                             "/val.jsonl --steps 3 --global-batch 8 --seq-len 32 --seed 3";
  const std::string w1 = root_ + "/w1.jsonl", w2 = root_ + "/w2.jsonl";
  const std::string batches = root_ + "/w1_batches.bin";
  const CommandResult one = run_fsdp_train("--no-fsdp --quiet " + common + " --metrics " + w1 +
                                           " --dump-batches " + batches);
  ASSERT_EQ(one.exit_code, 0) << one.output;
  // Two ranks of two accumulated slices each: four partial sums over one count.
  const CommandResult two =
      run_fsdp_train("--nproc 2 --grad-accum 2 " + common + " --metrics " + w2);
  ASSERT_EQ(two.exit_code, 0) << two.output;
  EXPECT_THAT(two.output, HasSubstr("fine-tuning data:"));
  expect_same_steps(w2, w1, 3);
  const auto got = read_json_lines(w2), want = read_json_lines(w1);
  const double val = got[2]["val_loss"], ref_val = want[2]["val_loss"];
  EXPECT_NEAR(val, ref_val, 1e-5 * ref_val);
  const std::vector<int64_t> trained = trained_per_step(batches);
  ASSERT_EQ(trained.size(), 3u);
  for (size_t s = 0; s < 3; ++s) {
    EXPECT_GT(trained[s], 0);
    EXPECT_LT(trained[s], 8 * 32) << "step " << s + 1 << " has no masked target";
    const double tokens = want[s]["tokens_per_s"].get<double>() * want[s]["step_s"].get<double>();
    EXPECT_NEAR(tokens, double(trained[s]), 1e-6 * double(trained[s])) << "step " << s + 1;
  }
}

TEST_F(FsdpTrainFinetune, ALabeledShardTrainsAsItsJsonLines) {
  const std::string shard = root_ + "/train.bin";
  const CommandResult tokenized =
      run_command(program_path("fsdp-tokenize") + " --tokenizer " + tokenizer() + " --output " +
                      shard + " " + root_ + "/train.jsonl",
                  120);
  ASSERT_EQ(tokenized.exit_code, 0) << tokenized.output;
  EXPECT_THAT(tokenized.output, HasSubstr("labeled:"));
  const std::string common =
      "--no-fsdp --quiet --model tiny --steps 2 --global-batch 4 "
      "--seq-len 32 --seed 4 --vocab-size 260";
  const std::string from_json = root_ + "/json.jsonl", from_shard = root_ + "/shard.jsonl";
  const CommandResult a = run_fsdp_train(common + " --tokenizer " + tokenizer() + " --data " +
                                         root_ + "/train.jsonl --metrics " + from_json);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const CommandResult b = run_fsdp_train(common + " --data " + shard + " --metrics " + from_shard);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const auto want = read_json_lines(from_json), got = read_json_lines(from_shard);
  ASSERT_EQ(want.size(), 2u);
  ASSERT_EQ(got.size(), 2u);
  for (size_t s = 0; s < 2; ++s) {
    EXPECT_EQ(got[s]["loss"].get<double>(), want[s]["loss"].get<double>()) << "step " << s + 1;
  }
}

TEST_F(FsdpTrainFinetune, MalformedExamplesAreRefusedBeforeTraining) {
  const std::string bad = root_ + "/bad.jsonl";
  ASSERT_TRUE(write_bytes(bad, examples(3, 0) + R"({"input_ids": [1, 2], "labels": [-100]})"
                                                "\n"));
  const CommandResult r = run_fsdp_train("--no-fsdp --quiet --model tiny --tokenizer " +
                                         tokenizer() + " --data " + bad + " --steps 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("bad.jsonl:4: a record of the input_ids/labels form in a file "
                                  "of the prompt/completion form"));
  EXPECT_THAT(r.output, Not(HasSubstr("step ")));
}

}  // namespace
}  // namespace fsdp::test
