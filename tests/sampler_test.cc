#include <gtest/gtest.h>

#include <map>

#include "engine/sampler.h"

namespace kvs {
namespace {

std::vector<float> Logits() {
  return {1.0f, 3.0f, 2.0f, 0.5f, 2.9f, -1.0f};
}

TEST(Sampler, GreedyPicksArgmax) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p, 6);
  auto l = Logits();
  EXPECT_EQ(s.Sample(l.data(), {}), 1);
}

TEST(Sampler, SameSeedSameSequence) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1;
  p.min_p = 0;
  p.seed = 123;
  Sampler a(p, 6), b(p, 6);
  auto l = Logits();
  std::vector<int32_t> sa, sb;
  for (int i = 0; i < 50; ++i) {
    sa.push_back(a.Sample(l.data(), {}));
    sb.push_back(b.Sample(l.data(), {}));
  }
  EXPECT_EQ(sa, sb);
  p.seed = 124;
  Sampler c(p, 6);
  std::vector<int32_t> sc;
  for (int i = 0; i < 50; ++i) sc.push_back(c.Sample(l.data(), {}));
  EXPECT_NE(sa, sc);
}

TEST(Sampler, TopKRestrictsTheChoice) {
  SamplingParams p;
  p.temperature = 5.0f;  // flat enough that everything would otherwise appear
  p.top_k = 2;
  p.top_p = 1;
  p.min_p = 0;
  Sampler s(p, 6);
  auto l = Logits();
  for (int i = 0; i < 200; ++i) {
    int32_t t = s.Sample(l.data(), {});
    EXPECT_TRUE(t == 1 || t == 4) << t;
  }
}

TEST(Sampler, TopPKeepsTheSmallestNucleus) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 0.5f;  // softmax of Logits(): p(1) ~ 0.37, p(4) ~ 0.33 -> nucleus {1, 4}
  p.min_p = 0;
  Sampler s(p, 6);
  auto l = Logits();
  std::map<int32_t, int> seen;
  for (int i = 0; i < 400; ++i) ++seen[s.Sample(l.data(), {})];
  EXPECT_EQ(seen.size(), 2u);
  EXPECT_GT(seen[1], 100);
  EXPECT_GT(seen[4], 100);
}

TEST(Sampler, MinPDropsUnlikelyTokens) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1;
  p.min_p = 0.3f;  // keeps tokens with p >= 0.3 * p(max): ids 1, 4, 2 (e^-1 = 0.37)
  Sampler s(p, 6);
  auto l = Logits();
  std::map<int32_t, int> seen;
  for (int i = 0; i < 600; ++i) ++seen[s.Sample(l.data(), {})];
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen.count(0), 0u);
  EXPECT_EQ(seen.count(3), 0u);
  EXPECT_EQ(seen.count(5), 0u);
}

TEST(Sampler, TemperatureSharpensAndFlattens) {
  auto l = Logits();
  auto count_top = [&](float temp) {
    SamplingParams p;
    p.temperature = temp;
    p.top_k = 0;
    p.top_p = 1;
    p.min_p = 0;
    Sampler s(p, 6);
    int top = 0;
    for (int i = 0; i < 1000; ++i) top += s.Sample(l.data(), {}) == 1;
    return top;
  };
  EXPECT_GT(count_top(0.1f), 600);
  EXPECT_LT(count_top(3.0f), 400);
}

TEST(Sampler, RepetitionPenaltyAndFrequencyPresence) {
  SamplingParams p;
  p.repeat_penalty = 2.0f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  Sampler s(p, 6);
  std::vector<float> l = {1.0f, 3.0f, -2.0f, 0.5f, 2.9f, -1.0f};
  std::vector<int32_t> history = {1, 1, 2};
  s.ApplyPenalties(l, history);
  EXPECT_FLOAT_EQ(l[1], 3.0f / 2 - 2 * 0.5f - 0.25f);   // positive: divided
  EXPECT_FLOAT_EQ(l[2], -2.0f * 2 - 1 * 0.5f - 0.25f);  // negative: multiplied
  EXPECT_FLOAT_EQ(l[0], 1.0f);                          // not in history
  // A second application starts from clean counts.
  std::vector<float> l2 = {1.0f, 3.0f, -2.0f, 0.5f, 2.9f, -1.0f};
  s.ApplyPenalties(l2, history);
  EXPECT_FLOAT_EQ(l2[1], l[1]);
}

TEST(Sampler, PenaltyWindowLooksOnlyAtRecentTokens) {
  SamplingParams p;
  p.repeat_penalty = 2.0f;
  p.repeat_last_n = 1;
  Sampler s(p, 6);
  std::vector<float> l = {1.0f, 3.0f, 2.0f, 0.5f, 2.9f, -1.0f};
  std::vector<int32_t> history = {1, 2};
  s.ApplyPenalties(l, history);
  EXPECT_FLOAT_EQ(l[1], 3.0f);
  EXPECT_FLOAT_EQ(l[2], 1.0f);
}

TEST(Sampler, ValidateRejectsAbsurdValues) {
  SamplingParams p;
  EXPECT_TRUE(p.Validate().ok());
  p.temperature = -1;
  EXPECT_NE(p.Validate().message().find("temperature"), std::string::npos);
  p = {};
  p.top_p = 2;
  EXPECT_NE(p.Validate().message().find("top_p"), std::string::npos);
  p = {};
  p.repeat_penalty = 0;
  EXPECT_FALSE(p.Validate().ok());
  p = {};
  p.temperature = NAN;
  EXPECT_FALSE(p.Validate().ok());
}

}  // namespace
}  // namespace kvs
