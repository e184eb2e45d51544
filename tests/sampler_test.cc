#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

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

SamplingParams Params(float temperature, int32_t top_k, float top_p, float min_p,
                      bool penalties = false, uint64_t seed = 1) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  if (penalties) {
    p.repeat_penalty = 1.5f;
    p.frequency_penalty = 0.3f;
    p.presence_penalty = 0.2f;
    p.repeat_last_n = 8;
  }
  p.seed = seed;
  return p;
}

// 32 logits with a spread that top-k, top-p and min-p all cut into, and a tie (ids 3 and 7).
std::vector<float> WideLogits() {
  std::vector<float> l(32);
  for (int i = 0; i < 32; ++i) l[i] = std::sin(i * 1.7f) * 3.0f;
  l[7] = l[3];
  return l;
}

// The sampler's distribution is scratch that its next call overwrites.
std::vector<TokenProb> Copy(std::span<const TokenProb> probs) {
  return {probs.begin(), probs.end()};
}

// Several parameter settings: every temperature kind, each cut on and off, penalties on and off.
std::vector<SamplingParams> Grid() {
  std::vector<SamplingParams> grid;
  uint64_t seed = 1;
  for (float temp : {0.f, 0.5f, 1.f, 2.f}) {
    for (int32_t top_k : {0, 5}) {
      for (float top_p : {1.f, 0.8f}) {
        for (float min_p : {0.f, 0.1f}) {
          for (bool pen : {false, true})
            grid.push_back(Params(temp, top_k, top_p, min_p, pen, seed++));
        }
      }
    }
  }
  return grid;
}

std::string Describe(const SamplingParams& p) {
  return "temperature " + std::to_string(p.temperature) + " top_k " + std::to_string(p.top_k) +
         " top_p " + std::to_string(p.top_p) + " min_p " + std::to_string(p.min_p) +
         " repeat_penalty " + std::to_string(p.repeat_penalty);
}

// Tokens Sample drew before the distribution API existed, recorded from that build: the API was
// added without changing a single draw.
TEST(Sampler, SampleDrawsTheTokensItDrewBeforeTheDistributionApi) {
  struct Case {
    SamplingParams params;
    std::vector<int32_t> tokens;
  };
  SamplingParams pen_all = Params(0.5f, 0, 1, 0, false, 4);
  pen_all.repeat_penalty = 1.2f;
  pen_all.repeat_last_n = -1;
  const Case cases[] = {
      {Params(1, 0, 1, 0, false, 1), {1, 1, 4, 1, 1, 0, 4, 1, 4, 4, 1, 4, 2, 1, 4, 1,
                                      1, 2, 4, 1, 1, 4, 4, 1, 1, 1, 1, 1, 4, 4, 2, 1}},
      {Params(0.8f, 40, 0.95f, 0.05f, false, 2), {2, 2, 4, 2, 1, 1, 1, 1, 1, 4, 4, 0, 4, 1, 1, 1,
                                                  0, 4, 1, 1, 1, 1, 4, 1, 4, 1, 4, 1, 1, 1, 1, 1}},
      {Params(2, 3, 0.9f, 0.1f, true, 3), {4, 1, 1, 2, 1, 4, 1, 0, 2, 4, 4, 4, 2, 4, 1, 1,
                                           1, 2, 4, 1, 0, 4, 4, 1, 4, 1, 2, 2, 4, 0, 1, 1}},
      {pen_all, {4, 1, 4, 1, 4, 1, 2, 1, 4, 4, 4, 1, 1, 1, 2, 4,
                 1, 1, 2, 4, 4, 1, 2, 1, 1, 1, 2, 2, 1, 1, 1, 1}},
  };
  auto l = Logits();
  for (const Case& c : cases) {
    Sampler s(c.params, 6);
    std::vector<int32_t> history;
    for (size_t i = 0; i < c.tokens.size(); ++i) history.push_back(s.Sample(l.data(), history));
    EXPECT_EQ(history, c.tokens) << Describe(c.params);
  }
}

TEST(Sampler, DistributionSumsToOneAndHoldsTheDrawnToken) {
  auto l = WideLogits();
  const std::vector<int32_t> history = {1, 3, 3, 9, 20, 3};
  for (const SamplingParams& p : Grid()) {
    SCOPED_TRACE(Describe(p));
    Sampler s(p, 32);
    for (int draw = 0; draw < 50; ++draw) {
      SampledToken st = s.SampleWithDistribution(l.data(), history);
      ASSERT_FALSE(st.probs.empty());
      double sum = 0;
      std::set<int32_t> ids;
      bool drawn_listed = false;
      for (size_t i = 0; i < st.probs.size(); ++i) {
        const TokenProb& tp = st.probs[i];
        EXPECT_GT(tp.p, 0.f);
        EXPECT_TRUE(tp.id >= 0 && tp.id < 32) << tp.id;
        EXPECT_TRUE(ids.insert(tp.id).second) << "listed twice: " << tp.id;
        if (i > 0) {
          EXPECT_LE(tp.p, st.probs[i - 1].p);  // most likely first
        }
        if (tp.id == st.token) drawn_listed = true;
        sum += tp.p;
      }
      EXPECT_NEAR(sum, 1.0, 1e-6);
      EXPECT_TRUE(drawn_listed) << "drew " << st.token << ", which has probability 0";
      if (p.temperature <= 0) {
        std::vector<float> penalized = l;
        s.ApplyPenalties(penalized, history);
        ASSERT_EQ(st.probs.size(), 1u);
        EXPECT_EQ(st.probs[0].id, ArgMax(penalized.data(), 32));
        EXPECT_EQ(st.probs[0].p, 1.f);
        EXPECT_EQ(st.token, st.probs[0].id);
      }
    }
    // Distribution without a draw lists the same thing.
    std::vector<TokenProb> sampled = Copy(s.SampleWithDistribution(l.data(), history).probs);
    std::span<const TokenProb> plain = s.Distribution(l.data(), history);
    ASSERT_EQ(plain.size(), sampled.size());
    for (size_t i = 0; i < plain.size(); ++i) {
      EXPECT_EQ(plain[i].id, sampled[i].id);
      EXPECT_EQ(plain[i].p, sampled[i].p);
    }
  }
}

// Counts `n` draws per token and checks each against its probability within 5 standard
// deviations (plus one count for discreteness): the seeds are fixed, so this is deterministic,
// and a correct sampler would miss the bound with odds of about 1e-6 per token and seed.
void ExpectFrequenciesMatch(std::span<const TokenProb> probs, const std::map<int32_t, int>& seen,
                            int n) {
  double total = 0;
  for (const TokenProb& tp : probs) total += std::max(tp.p, 0.f);
  std::map<int32_t, double> expected;
  for (const TokenProb& tp : probs) expected[tp.id] += std::max(tp.p, 0.f) / total;
  for (const auto& [id, count] : seen) {
    EXPECT_GT(expected[id], 0.0) << "drew token " << id << " with probability 0";
  }
  for (const auto& [id, q] : expected) {
    auto it = seen.find(id);
    const double count = it == seen.end() ? 0 : it->second;
    const double bound = 5 * std::sqrt(n * q * (1 - q)) + 1;
    EXPECT_LE(std::fabs(count - n * q), bound) << "token " << id << " p " << q;
  }
}

TEST(Sampler, DrawnTokensFollowTheReturnedDistribution) {
  auto l = WideLogits();
  const std::vector<int32_t> history = {1, 3, 3, 9, 20, 3};
  const int n = 20000;
  for (const SamplingParams& p : {Params(1, 0, 1, 0), Params(0.7f, 8, 0.9f, 0.02f, false, 7),
                                  Params(2, 0, 1, 0, true, 8), Params(0.5f, 5, 1, 0.1f, true, 9)}) {
    SCOPED_TRACE(Describe(p));
    Sampler s(p, 32);
    std::vector<TokenProb> first = Copy(s.Distribution(l.data(), history));
    ASSERT_GT(first.size(), 1u);  // a real choice, not a greedy pick
    std::map<int32_t, int> seen;
    for (int i = 0; i < n; ++i) {
      SampledToken st = s.SampleWithDistribution(l.data(), history);
      ++seen[st.token];
    }
    ExpectFrequenciesMatch(first, seen, n);
    // A fresh sampler per seed draws from the same distribution.
    std::map<int32_t, int> seen_seeds;
    for (int i = 0; i < n; ++i) {
      SamplingParams q = p;
      q.seed = 1000003ull * i + 17;
      Sampler one(q, 32);
      ++seen_seeds[one.Sample(l.data(), history)];
    }
    ExpectFrequenciesMatch(first, seen_seeds, n);
  }
}

TEST(Sampler, DistributionLeavesOutProbabilitiesThatRoundToZero) {
  // At temperature 0.01: p(1) ~ e^-50 is a small float, p(2) ~ e^-200 rounds to 0 as a float,
  // and p(3)'s weight e^-1000 is 0 even as a double. Neither is listed nor ever drawn.
  const std::vector<float> l = {0.f, -0.5f, -2.f, -10.f};
  Sampler s(Params(0.01f, 0, 1, 0), 4);
  std::vector<TokenProb> d = Copy(s.Distribution(l.data(), {}));
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].id, 0);
  EXPECT_EQ(d[1].id, 1);
  EXPECT_GT(d[1].p, 0.f);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(s.SampleWithDistribution(l.data(), {}).token, 0);
}

TEST(Sampler, DrawFollowsUnnormalizedWeightsAndSkipsZeros) {
  // A max(0, p - q) residual as speculative decoding builds it: unnormalized, with zeros.
  const std::vector<TokenProb> residual = {{4, 0.f},   {2, 0.05f}, {9, 0.f},  {0, 0.15f},
                                           {7, 0.01f}, {3, -0.f},  {5, 0.09f}};
  Sampler s(Params(1, 0, 1, 0), 10);
  const int n = 20000;
  std::map<int32_t, int> seen;
  for (int i = 0; i < n; ++i) ++seen[s.Draw(residual)];
  ExpectFrequenciesMatch(residual, seen, n);
  EXPECT_EQ(seen.count(4) + seen.count(9) + seen.count(3), 0u);

  for (int i = 0; i < 1000; ++i) {
    const double u = s.Uniform();
    ASSERT_TRUE(u >= 0 && u < 1) << u;
  }
}

TEST(Sampler, InFlightTokensArePenalizedLikeAppendedHistory) {
  const std::vector<int32_t> sequence = {1, 4, 4, 2, 1, 5, 0, 4, 1, 1, 3, 4};
  auto base = Logits();
  for (int32_t last_n : {-1, 0, 1, 3, 5, 100}) {
    SamplingParams p = Params(1.3f, 4, 0.9f, 0.05f, true, 11);
    p.repeat_last_n = last_n;
    for (size_t split = 0; split <= sequence.size(); ++split) {
      SCOPED_TRACE("repeat_last_n " + std::to_string(last_n) + " split " + std::to_string(split));
      std::span<const int32_t> all(sequence);
      std::span<const int32_t> committed = all.first(split);
      std::span<const int32_t> in_flight = all.subspan(split);
      Sampler a(p, 6), b(p, 6);

      std::vector<float> la = base, lb = base;
      a.ApplyPenalties(la, all);
      b.ApplyPenalties(lb, committed, in_flight);
      EXPECT_EQ(la, lb);

      std::vector<TokenProb> da = Copy(a.Distribution(base.data(), all));
      std::span<const TokenProb> db = b.Distribution(base.data(), committed, in_flight);
      ASSERT_EQ(da.size(), db.size());
      for (size_t i = 0; i < da.size(); ++i) {
        EXPECT_EQ(da[i].id, db[i].id);
        EXPECT_EQ(da[i].p, db[i].p);
      }
      for (int i = 0; i < 20; ++i) {
        EXPECT_EQ(a.Sample(base.data(), all), b.Sample(base.data(), committed, in_flight));
      }
    }
  }
}

TEST(Sampler, SampleAndTheDistributionApiDrawTheSameTokens) {
  auto l = WideLogits();
  for (const SamplingParams& p : Grid()) {
    SCOPED_TRACE(Describe(p));
    Sampler old_api(p, 32), new_api(p, 32);
    std::vector<int32_t> history_old, history_new;
    for (int i = 0; i < 100; ++i) {
      history_old.push_back(old_api.Sample(l.data(), history_old));
      // Distribution takes no randomness, so asking for it between draws changes nothing.
      if (i % 3 == 0) new_api.Distribution(l.data(), history_new);
      history_new.push_back(new_api.SampleWithDistribution(l.data(), history_new).token);
    }
    EXPECT_EQ(history_old, history_new);
  }
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
