// fsdp-train --wrap-policy: `block` (the default) is today's run bit for bit, the units are
// listed once at start and counted in --metrics; min-params:N trains to the --no-fsdp
// reference within 1e-5 with the units FSDP1's size-based rule gives.
#include "support/test_support.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

namespace fsdp::train {
namespace {

using test::CommandResult;
using test::read_json_lines;
using test::run_fsdp_train;
using ::testing::HasSubstr;

std::string temp_path(const std::string& name) {
  return test::temp_path("fsdp_train_wrap_" + name);
}

int count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

const char* kCommon = "--model tiny --steps 4 --global-batch 4 --seq-len 16 --seed 3 --log-every 1";

TEST(FsdpTrainWrap, BlockIsTheDefaultBitForBit) {
  const std::string plain = temp_path("default.jsonl"), block = temp_path("block.jsonl");
  const CommandResult a =
      run_fsdp_train(std::string("--nproc 2 ") + kCommon + " --metrics " + plain);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  const CommandResult b = run_fsdp_train(std::string("--nproc 2 ") + kCommon +
                                         " --wrap-policy block --metrics " + block);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  // One line at start, from rank 0 only: the units in pre-order, the root first.
  EXPECT_EQ(count(b.output, "FSDP units"), 1) << b.output;
  EXPECT_THAT(b.output, HasSubstr("3 FSDP units (--wrap-policy block), parameter elements each: "
                                  "root (10304), transformer.h.0 (12704), transformer.h.1 "
                                  "(12704)"));
  const auto got = read_json_lines(block), want = read_json_lines(plain);
  ASSERT_EQ(got.size(), 4u);
  ASSERT_EQ(want.size(), 4u);
  for (size_t s = 0; s < got.size(); ++s) {
    EXPECT_EQ(got[s]["loss"].get<double>(), want[s]["loss"].get<double>()) << "step " << s + 1;
    EXPECT_EQ(got[s]["grad_norm"].get<double>(), want[s]["grad_norm"].get<double>());
    EXPECT_EQ(got[s]["units"], 3);
    EXPECT_EQ(want[s]["units"], 3);
  }
}

TEST(FsdpTrainWrap, MinParamsMatchesTheReference) {
  const std::string sharded = temp_path("min.jsonl"), reference = temp_path("ref.jsonl");
  // Tiny GPT-2 at 4,200: each block's attn (4,224) and mlp.c_fc (4,224) are units, and the
  // blocks keep 12,704 - 2 x 4,224 = 4,256 >= 4,200, so they are units too; the transformer
  // holds the tied wte and stays in the root.
  const CommandResult a = run_fsdp_train(std::string("--nproc 2 ") + kCommon +
                                         " --wrap-policy min-params:4200 --metrics " + sharded);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_THAT(a.output,
              HasSubstr("7 FSDP units (--wrap-policy min-params:4200), parameter elements each: "
                        "root (10304), transformer.h.0 (4256), transformer.h.0.attn (4224), "
                        "transformer.h.0.mlp.c_fc (4224), transformer.h.1 (4256), "
                        "transformer.h.1.attn (4224), transformer.h.1.mlp.c_fc (4224)"));
  const CommandResult b =
      run_fsdp_train(std::string("--no-fsdp ") + kCommon + " --quiet --metrics " + reference);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const auto got = read_json_lines(sharded), want = read_json_lines(reference);
  ASSERT_EQ(got.size(), 4u);
  ASSERT_EQ(want.size(), 4u);
  for (size_t s = 0; s < got.size(); ++s) {
    const double loss = got[s]["loss"], ref_loss = want[s]["loss"];
    const double norm = got[s]["grad_norm"], ref_norm = want[s]["grad_norm"];
    EXPECT_NEAR(loss, ref_loss, 1e-5 * ref_loss) << "step " << s + 1;
    EXPECT_NEAR(norm, ref_norm, 1e-5 * ref_norm) << "step " << s + 1;
    EXPECT_EQ(got[s]["units"], 7);
    EXPECT_EQ(want[s]["units"], 0);
  }
}

TEST(FsdpTrainWrap, QuietListsNothing) {
  const CommandResult a =
      run_fsdp_train(std::string("--nproc 2 ") + kCommon + " --quiet --wrap-policy min-params:1");
  ASSERT_EQ(a.exit_code, 0) << a.output;
  EXPECT_EQ(count(a.output, "FSDP units"), 0) << a.output;
}

}  // namespace
}  // namespace fsdp::train
