// KeptPagesRule ([Note: a bound on the kept pages]): when the trainer gives jemalloc's kept
// pages back, from the bytes kept at each step's end. fsdp-train's own run of it is
// FsdpTrain.AStepAfterTheFirstFaultsInNoNewPagesAndSetUpsPagesAreGivenBack
// (test_fsdp_train.cpp).
#include <common/kept_host_pages.h>

#include <gtest/gtest.h>

#include <cstdint>

namespace fsdp::tools {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;

// The largest bytes a step may keep after the need was measured as need.
int64_t bound(int64_t need) {
  return static_cast<int64_t>(KeptPagesRule::kGrowth * static_cast<double>(need)) +
         KeptPagesRule::kSlackBytes;
}

// Sets a new rule's need to need: its measuring steps.
void measure(KeptPagesRule& rule, int64_t need) {
  for (int i = 0; i < KeptPagesRule::kMeasuringSteps; ++i) ASSERT_FALSE(rule.give_back(need));
  ASSERT_EQ(rule.need(), need);
}

TEST(KeptPagesRule, TheFirstStepsMeasureTheNeed) {
  static_assert(KeptPagesRule::kMeasuringSteps == 2);
  KeptPagesRule rule;
  EXPECT_FALSE(rule.need().has_value());
  // The first step after a give-back keeps less than the next (GPT-2 HSDP: 1,542 then 1,777
  // MB): the need is the most of the two, and neither gives back, however much it keeps.
  EXPECT_FALSE(rule.give_back(1542 * kMiB));
  EXPECT_FALSE(rule.need().has_value());
  EXPECT_FALSE(rule.give_back(1777 * kMiB));
  EXPECT_EQ(rule.need(), 1777 * kMiB);
  KeptPagesRule other;
  EXPECT_FALSE(other.give_back(900 * kMiB));
  EXPECT_FALSE(other.give_back(100 * kMiB));
  EXPECT_EQ(other.need(), 900 * kMiB);
}

TEST(KeptPagesRule, KeepsUpToTheBoundAndGivesBackPastIt) {
  KeptPagesRule rule;
  measure(rule, 400 * kMiB);
  EXPECT_FALSE(rule.give_back(bound(400 * kMiB)));
  EXPECT_FALSE(rule.give_back(300 * kMiB));  // fewer kept: the need stays as measured
  EXPECT_EQ(rule.need(), 400 * kMiB);
  EXPECT_TRUE(rule.give_back(bound(400 * kMiB) + 1));
  EXPECT_FALSE(rule.need().has_value());
  // The steps after a give-back measure the need anew, smaller or larger than before.
  EXPECT_FALSE(rule.give_back(600 * kMiB));
  EXPECT_FALSE(rule.give_back(500 * kMiB));
  EXPECT_EQ(rule.need(), 600 * kMiB);
  EXPECT_FALSE(rule.give_back(bound(600 * kMiB)));
  EXPECT_TRUE(rule.give_back(bound(600 * kMiB) + 1));
}

// What kept within the bound does not raise it: a slow growth (fragmentation) is given back once
// it has grown by the bound, not carried along step by step.
TEST(KeptPagesRule, ASlowGrowthIsGivenBackWhenItCrossesTheBound) {
  KeptPagesRule rule;
  const int64_t need = 100 * kMiB;
  measure(rule, need);
  int64_t kept = need;
  int steps = 0;
  while (!rule.give_back(kept += kMiB / 4)) ++steps;
  EXPECT_GT(kept, bound(need));
  EXPECT_LE(kept, bound(need) + kMiB / 4);
  EXPECT_EQ(steps, (bound(need) - need) / (kMiB / 4));  // every one within the bound kept
}

// A model whose steps free a few pages keeps them: the slack, not the growth, bounds it.
TEST(KeptPagesRule, TheSlackBoundsASmallNeed) {
  KeptPagesRule rule;
  measure(rule, 0);
  EXPECT_FALSE(rule.give_back(KeptPagesRule::kSlackBytes));
  EXPECT_TRUE(rule.give_back(KeptPagesRule::kSlackBytes + 1));
}

}  // namespace
}  // namespace fsdp::tools
