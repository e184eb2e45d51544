// The step cost model of stall-free batching: a fit of step time against tokens from given
// observations (no clock).
#include "engine/step_cost_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace kvs {
namespace {

TEST(StepCostModel, FitsStartAndPerTokenCostFromStepsOfManySizes) {
  StepCostModel model;
  EXPECT_FALSE(model.ready());
  EXPECT_EQ(model.TokensWithin(1.0), 0);
  for (int round = 0; round < 3; ++round) {
    for (int32_t n : {1, 16, 64, 512, 100}) model.Observe(n, 0.010 + 0.002 * n);
  }
  ASSERT_TRUE(model.ready());
  EXPECT_NEAR(model.intercept(), 0.010, 1e-9);
  EXPECT_NEAR(model.per_token(), 0.002, 1e-12);
  EXPECT_EQ(model.TokensWithin(0.150), 70);  // (0.150 - 0.010) / 0.002
  EXPECT_EQ(model.TokensWithin(0.010), 0);   // the start alone fills it
}

TEST(StepCostModel, StepsOfOneSizeGiveTheAverageCostPerToken) {
  StepCostModel model;
  for (int i = 0; i < 5; ++i) model.Observe(100, 0.2);
  EXPECT_EQ(model.intercept(), 0);
  EXPECT_NEAR(model.per_token(), 0.002, 1e-12);
  EXPECT_EQ(model.TokensWithin(0.15), 75);
}

TEST(StepCostModel, RecentStepsOutweighOldOnesWhenTheMachineSlowsDown) {
  StepCostModel model(0.9);
  for (int i = 0; i < 50; ++i) model.Observe(i % 2 ? 32 : 256, 0.005 + 0.002 * (i % 2 ? 32 : 256));
  for (int i = 0; i < 40; ++i) model.Observe(i % 2 ? 32 : 256, 0.010 + 0.004 * (i % 2 ? 32 : 256));
  EXPECT_NEAR(model.per_token(), 0.004, 0.004 * 0.05);
}

TEST(StepCostModel, NonsenseObservationsAreIgnoredAndAFallingFitFallsBack) {
  StepCostModel model;
  model.Observe(0, 1.0);
  model.Observe(-5, 1.0);
  model.Observe(10, -1.0);
  model.Observe(10, std::numeric_limits<double>::quiet_NaN());
  model.Observe(10, std::numeric_limits<double>::infinity());
  EXPECT_FALSE(model.ready());
  // Bigger steps that took less time (noise): a negative slope is no model; the average
  // cost per token is used instead.
  model.Observe(10, 0.5);
  model.Observe(100, 0.1);
  EXPECT_GT(model.per_token(), 0);
  EXPECT_EQ(model.intercept(), 0);
  EXPECT_NEAR(model.per_token(), (0.9 * 0.5 + 0.1) / (0.9 * 10 + 100), 1e-9);
}

TEST(StepCostModel, OneSlowStepCountsForAtMostThreeTimesItsPrediction) {
  StepCostModel model;
  for (int i = 0; i < 20; ++i) model.Observe(i % 2 ? 8 : 64, 0.020 + 0.001 * (i % 2 ? 8 : 64));
  const int32_t before = model.TokensWithin(0.100);
  EXPECT_EQ(before, 80);
  model.Observe(8, 2.0);  // a page-fault storm: 2 s for a step predicted at 28 ms
  // Counted as 84 ms, the fit moves a little, not to a cap of a few tokens.
  EXPECT_GE(model.TokensWithin(0.100), before / 2);
  for (int i = 0; i < 10; ++i) model.Observe(i % 2 ? 8 : 64, 0.020 + 0.001 * (i % 2 ? 8 : 64));
  EXPECT_NEAR(model.TokensWithin(0.100), before, 3);
}

TEST(StepCostModel, StepsThatTookNoTimeLeaveStepsUnlimited) {
  StepCostModel model;  // a clock too coarse to see a step
  for (int32_t n : {1, 16, 64}) model.Observe(n, 0.0);
  ASSERT_TRUE(model.ready());
  EXPECT_EQ(model.TokensWithin(0.1), StepCostModel::kUnlimited);
}

TEST(StepCostModel, OverheadTokensAreTheFixedCostInTokens) {
  StepCostModel m;
  EXPECT_EQ(m.OverheadTokens(), 0);  // nothing observed
  m.Observe(10, 0.030);              // one size: no fixed cost seen
  EXPECT_EQ(m.OverheadTokens(), 0);
  m.Observe(110, 0.230);  // 2 ms a token, 10 ms fixed
  EXPECT_EQ(m.OverheadTokens(), 5);
}

}  // namespace
}  // namespace kvs
