// Speculative decoding keeps the output distribution exactly the target's: a statistical test.
//
// A tiny "model" (a bigram table of fixed pseudo-random logits over a 10-token vocabulary, so
// that the joint of two tokens is not a product) is sampled at temperature 1 with top-k and
// top-p (and in one case penalties, which make the next token's distribution depend on the
// drafts in flight), with a deliberately poor draft (another bigram table) so that rejections
// are frequent. The empirical joint of the first tokens emitted is compared with the target's
// exact joint, computed from Sampler::Distribution, by a chi-square test at a 1e-6 false-alarm
// rate and by a total-variation bound (also 1e-6), with fixed seeds. The negative controls run
// the same with a broken correction and require both statistics to exceed twice their bounds, so
// each assertion is shown to be able to fail.
//
// Two levels: VerifyDrafts in a loop that mimics the engine's, and the real Engine with a fake
// runner following the bigram table and a fake drafter sampling from the poor one. Both controls
// break q: the drafts are reported with probabilities that are not the ones they were drawn from.
//
// Measured (Release, the 2-core dev machine): the whole test ~2.4 s; under ASan+UBSan ~21 s.
// Statistics with the exact rule sit at their null expectation (chi2 ~ df) and stayed there at 20x
// the samples (4M unit, 1M engine); the controls exceed the thresholds by 100x or more.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "engine/engine.h"
#include "engine/sampler.h"
#include "engine/spec/rejection_sampler.h"
#include "engine/step_sampler.h"

namespace kvs {
namespace {

constexpr int32_t kV = 10;

// A bigram "model": row t holds the logits of the token after t.
struct Bigram {
  std::vector<float> logits;  // [kV][kV]
  const float* Row(int32_t prev) const { return logits.data() + static_cast<size_t>(prev) * kV; }
};

// Logits ~ N(0, scale^2), from a portable generator (Box-Muller on 53-bit uniforms), so the table
// is the same on every standard library.
Bigram MakeBigram(uint64_t seed, double scale) {
  std::mt19937_64 rng(seed);
  auto uniform = [&] { return (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53; };
  Bigram b;
  b.logits.resize(kV * kV);
  for (float& l : b.logits) {
    l = static_cast<float>(scale * std::sqrt(-2.0 * std::log(uniform())) *
                           std::cos(2.0 * M_PI * uniform()));
  }
  return b;
}

const Bigram& Target() {
  static const Bigram b = MakeBigram(20240611, 1.0);
  return b;
}
// The poor draft: 0.7 x the target's logits plus N(0, 1) noise of its own. With the parameters
// below its drafts are accepted 34-45% of the time (measured: unit 0.40, 0.40, 0.45; engine 0.34,
// 0.38), so that both the accepted path and the correction carry much of the output. (An
// unrelated table accepts ~15%, the target's plus the same noise ~50-60%; the negative controls
// fail by two orders of magnitude in all of these.)
const Bigram& PoorDraft() {
  static const Bigram b = [] {
    Bigram d = MakeBigram(777, 1.0);
    for (size_t i = 0; i < d.logits.size(); ++i) d.logits[i] += 0.7f * Target().logits[i];
    return d;
  }();
  return b;
}

SamplingParams Params(float repeat_penalty = 1.f, float presence_penalty = 0.f) {
  SamplingParams p;
  p.temperature = 1.f;
  p.top_k = 5;
  p.top_p = 0.9f;
  p.min_p = 0.f;
  p.repeat_penalty = repeat_penalty;
  p.presence_penalty = presence_penalty;
  p.repeat_last_n = -1;
  return p;
}

const std::vector<int32_t> kPrompt = {3, 7, 1};

// The target's exact joint of the next n tokens after `prompt`, indexed t0 * kV^(n-1) + ... +
// t_{n-1}: the product of the processed conditionals, penalties counting prompt and the tokens
// before.
std::vector<double> ExactJoint(const SamplingParams& params, const std::vector<int32_t>& prompt,
                               int32_t n) {
  Sampler s(params, kV);
  std::vector<double> joint(static_cast<size_t>(std::pow(kV, n)), 0.0);
  std::vector<int32_t> history = prompt;
  auto rec = [&](auto&& self, double p, size_t index, int32_t depth) -> void {
    if (depth == n) {
      joint[index] = p;
      return;
    }
    const std::vector<TokenProb> dist = [&] {
      auto d = s.Distribution(Target().Row(history.back()), history);
      return std::vector<TokenProb>(d.begin(), d.end());
    }();
    for (const TokenProb& tp : dist) {
      history.push_back(tp.id);
      self(self, p * tp.p, index * kV + tp.id, depth + 1);
      history.pop_back();
    }
  };
  rec(rec, 1.0, 0, 0);
  return joint;
}

// Upper 1e-6 quantile of chi-square with df degrees of freedom (Wilson-Hilferty: (X/df)^(1/3)
// is close to normal with mean 1 - 2/(9 df) and variance 2/(9 df); z = 4.7534 is the normal's
// upper 1e-6 quantile). Accurate to a few percent for df >= 3, far closer than the margins the
// negative controls show.
double ChiSquareThreshold(int32_t df) {
  const double z = 4.7534;
  const double v = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - v + z * std::sqrt(v), 3);
}

struct Fit {
  double chi2 = 0;
  int32_t df = 0;
  double threshold = 0;
  double tv = 0;           // total variation between the empirical and the exact joint
  double tv_bound = 0;     // what TV stays under but with probability 1e-6 (TvBound)
  int64_t impossible = 0;  // samples in cells the target gives probability 0
  int64_t n = 0;
};

// A bound on the total variation of the empirical distribution of n samples, exceeded with
// probability at most 1e-6: E[TV] = 1/2 sum_i E|c_i/n - p_i| <= 1/2 sum_i sqrt(p_i (1 - p_i) / n)
// <= 1/2 sqrt(cells / n) (Cauchy-Schwarz over the cells of the support), and TV moves by at most
// 1/n when one sample changes, so by McDiarmid P(TV >= E[TV] + t) <= exp(-2 n t^2), t =
// sqrt(ln(1e6) / (2 n)). Non-asymptotic, unlike the chi-square's threshold, and much looser: the
// chi-square is the sharper test, this one needs no approximation.
double TvBound(int32_t cells, double n) {
  return 0.5 * std::sqrt(cells / n) + std::sqrt(std::log(1e6) / (2 * n));
}

// Pearson's chi-square of counts against probabilities: cells with expected count >= 5 on their
// own, the rest pooled (smallest first) into one; if the pool stays under 5 it joins the
// smallest cell. Samples in a cell of probability 0 are counted apart (they fail the test).
Fit ChiSquare(const std::vector<int64_t>& counts, const std::vector<double>& probs) {
  Fit f;
  f.n = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  const double n = static_cast<double>(f.n);
  std::vector<std::pair<double, double>> cells, small;  // (expected, observed)
  int32_t support = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    f.tv += 0.5 * std::fabs(counts[i] / n - probs[i]);
    support += probs[i] > 0;
    if (probs[i] <= 0) {
      f.impossible += counts[i];
      continue;
    }
    const double e = n * probs[i];
    (e >= 5 ? cells : small).push_back({e, static_cast<double>(counts[i])});
  }
  std::pair<double, double> pool{0, 0};
  for (const auto& c : small) pool.first += c.first, pool.second += c.second;
  if (pool.first >= 5) {
    cells.push_back(pool);
  } else if (pool.first > 0) {
    auto smallest = std::min_element(cells.begin(), cells.end());
    smallest->first += pool.first;
    smallest->second += pool.second;
  }
  for (const auto& [e, o] : cells) f.chi2 += (o - e) * (o - e) / e;
  f.df = static_cast<int32_t>(cells.size()) - 1;
  f.threshold = ChiSquareThreshold(f.df);
  f.tv_bound = TvBound(support, n);
  return f;
}

void PrintFit(const char* what, const Fit& f, double acceptance) {
  std::printf(
      "  %-44s N=%lld chi2=%8.1f df=%3d threshold(1e-6)=%5.1f TV=%.4f bound=%.4f acceptance=%.3f\n",
      what, static_cast<long long>(f.n), f.chi2, f.df, f.threshold, f.tv, f.tv_bound, acceptance);
}

// ---------------------------------------------------------------------------------------------
// Unit level: VerifyDrafts in the engine's loop for one sequence.

struct UnitResult {
  std::vector<int64_t> counts;  // joint of the first n_out emitted tokens
  double acceptance = 0;        // accepted / tested drafts (tested: up to the first rejection)
};

// n_samples times: from the prompt, rounds of k drafts (the draft samples each from its
// processed distribution with the drafts before it in flight), the target's rows for the last
// committed token and each draft, VerifyDrafts; the accepted prefix and the token after it are
// appended, until n_out tokens are out.
// How a drafter reports q: truthfully, or (negative control) as the uniform distribution over
// the tokens its processed distribution kept: probabilities that do not match its draws. (Point
// masses would not do: verifying any proposal as q(d) = 1 keeps the target's distribution.)
enum class QReport { kTruth, kFlattened };

UnitResult SimulateVerify(const SamplingParams& params, int32_t k, int32_t n_out, int64_t n_samples,
                          QReport report, uint64_t seed) {
  SamplingParams tp = params, dp = params;
  tp.seed = seed;
  dp.seed = seed ^ 0x9E3779B97F4A7C15ull;
  Sampler target(tp, kV), draft(dp, kV);
  UnitResult r;
  r.counts.assign(static_cast<size_t>(std::pow(kV, n_out)), 0);
  int64_t tested = 0, accepted = 0;
  std::vector<int32_t> history, drafts, out;
  std::vector<std::vector<TokenProb>> q;
  std::vector<float> logits;
  for (int64_t s = 0; s < n_samples; ++s) {
    history = kPrompt;
    out.clear();
    while (static_cast<int32_t>(out.size()) < n_out) {
      drafts.clear();
      q.clear();
      for (int32_t j = 0; j < k; ++j) {
        const int32_t prev = j == 0 ? history.back() : drafts.back();
        const SampledToken st =
            draft.SampleWithDistribution(PoorDraft().Row(prev), history, drafts);
        drafts.push_back(st.token);
        q.emplace_back(st.probs.begin(), st.probs.end());
        if (report == QReport::kFlattened) {
          for (TokenProb& tp : q.back()) tp.p = 1.f / static_cast<float>(st.probs.size());
        }
      }
      logits.resize(static_cast<size_t>(k + 1) * kV);
      for (int32_t i = 0; i <= k; ++i) {
        const float* row = Target().Row(i == 0 ? history.back() : drafts[i - 1]);
        std::copy(row, row + kV, logits.begin() + static_cast<size_t>(i) * kV);
      }
      const VerifyResult v = VerifyDrafts(target, logits.data(), kV, history, drafts, q);
      EXPECT_GE(v.n_accepted, 0);
      EXPECT_LE(v.n_accepted, k);
      EXPECT_GE(v.next_token, 0);
      tested += v.n_accepted + (v.n_accepted < k ? 1 : 0);
      accepted += v.n_accepted;
      for (int32_t i = 0; i < v.n_accepted; ++i) {
        history.push_back(drafts[i]);
        out.push_back(drafts[i]);
      }
      history.push_back(v.next_token);
      out.push_back(v.next_token);
    }
    size_t index = 0;
    for (int32_t i = 0; i < n_out; ++i) index = index * kV + out[i];
    ++r.counts[index];
  }
  r.acceptance = static_cast<double>(accepted) / tested;
  return r;
}

struct UnitCase {
  const char* name;
  SamplingParams params;
  int32_t k;
  int32_t n_out;
};

std::vector<UnitCase> UnitCases() {
  return {
      {"top-k 5, top-p 0.9, k=2, 2 tokens", Params(), 2, 2},
      {"top-k 5, top-p 0.9, k=1, 2 tokens (bonus)", Params(), 1, 2},
      {"+ repeat 1.3, presence 0.5, k=2, 3 tokens", Params(1.3f, 0.5f), 2, 3},
  };
}

constexpr int64_t kUnitSamples = 200000;

TEST(SpecDistribution, VerifyDraftsEmitsTheTargetsJoint) {
  const auto t0 = std::chrono::steady_clock::now();
  for (const UnitCase& c : UnitCases()) {
    const std::vector<double> exact = ExactJoint(c.params, kPrompt, c.n_out);
    const UnitResult r =
        SimulateVerify(c.params, c.k, c.n_out, kUnitSamples, QReport::kTruth, 1234);
    const Fit f = ChiSquare(r.counts, exact);
    PrintFit(c.name, f, r.acceptance);
    // The draft is poor enough that rejections, and so the correction, are common.
    EXPECT_LT(r.acceptance, 0.7) << c.name;
    EXPECT_GT(r.acceptance, 0.2) << c.name;
    EXPECT_GT(f.df, 10) << c.name;
    EXPECT_EQ(f.impossible, 0) << c.name;
    EXPECT_LT(f.chi2, f.threshold) << c.name;
    EXPECT_LT(f.tv, f.tv_bound) << c.name;
  }
  std::printf("  %.2f s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

// The negative control: a q that is not what the drafts were drawn from biases the output (the
// acceptance ratio and the residual are computed from the wrong q), and the same statistic
// catches it.
TEST(SpecDistribution, VerifyDraftsWithAMisreportedDraftFailsTheSameTest) {
  for (const UnitCase& c : UnitCases()) {
    const std::vector<double> exact = ExactJoint(c.params, kPrompt, c.n_out);
    const UnitResult r =
        SimulateVerify(c.params, c.k, c.n_out, kUnitSamples, QReport::kFlattened, 1234);
    const Fit f = ChiSquare(r.counts, exact);
    PrintFit(c.name, f, r.acceptance);
    EXPECT_GT(f.chi2, 2 * f.threshold) << c.name;
    EXPECT_GT(f.tv, 2 * f.tv_bound) << c.name;
  }
}

// Greedy: drafts are accepted exactly while each is the argmax of its row (penalties counting
// the drafts before it); the first mismatch is replaced by that argmax, and after k matches
// the bonus is row k's argmax.
TEST(SpecDistribution, GreedyAcceptsExactlyWhileTheDraftIsTheArgmax) {
  std::mt19937_64 rng(99);
  for (const float penalty : {1.f, 1.5f}) {
    SamplingParams params = Params(penalty, penalty > 1 ? 0.7f : 0.f);
    params.temperature = 0;
    Sampler sampler(params, kV), reference(params, kV);
    for (int trial = 0; trial < 2000; ++trial) {
      const int32_t k = 1 + static_cast<int32_t>(rng() % 4);
      std::vector<int32_t> history = kPrompt;
      history.push_back(static_cast<int32_t>(rng() % kV));
      std::vector<int32_t> drafts;
      std::vector<float> logits(static_cast<size_t>(k + 1) * kV);
      std::vector<int32_t> argmax(k + 1);
      for (int32_t i = 0; i <= k; ++i) {
        std::span<float> row(logits.data() + static_cast<size_t>(i) * kV, kV);
        for (float& l : row) l = static_cast<float>(rng() % 1000) * 0.01f;
        std::vector<float> penalized(row.begin(), row.end());
        reference.ApplyPenalties(penalized, history, drafts);
        argmax[i] = ArgMax(penalized.data(), kV);
        // Each draft is the argmax three times in four.
        if (i < k) drafts.push_back(rng() % 4 ? argmax[i] : static_cast<int32_t>(rng() % kV));
      }
      int32_t want = 0;
      while (want < k && drafts[want] == argmax[want]) ++want;
      const VerifyResult v = VerifyDrafts(sampler, logits.data(), kV, history, drafts, {});
      ASSERT_EQ(v.n_accepted, want) << "trial " << trial;
      ASSERT_EQ(v.next_token, argmax[want]) << "trial " << trial;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Engine level: the real Engine, a runner whose logits follow the target's bigram table, a
// drafter sampling from the poor one.

// Logit row r of a run is the table's row for the token at its position.
class BigramRunner final : public StepRunner {
 public:
  int32_t n_vocab() const override { return kV; }
  Status CopyBlocks(std::span<const BlockCopy>) override { return Status::Ok(); }
  Status Execute(const StepBatch& step, StepOutput* out) override {
    KVS_RETURN_IF_ERROR(sampler_.Apply(step));
    logits_.resize(static_cast<size_t>(step.n_logit_rows) * kV);
    int32_t row = 0;
    for (const StepRun& r : step.runs) {
      for (int32_t i = 0; i < r.n_logits; ++i) {
        // The row of the run's token n_tokens - n_logits + i: the run carries it.
        const int32_t token = step.tokens[r.first_token + r.n_tokens - r.n_logits + i];
        const float* from = Target().Row(token);
        std::copy(from, from + kV, logits_.data() + static_cast<size_t>(row++) * kV);
      }
    }
    return sampler_.Sample(step, logits_.data(), out);
  }

 private:
  StepSampler sampler_{kV};
  std::vector<float> logits_;
};

// Drafts by sampling the poor table with the sequence's sampling parameters (its own RNG),
// penalties counting the committed tokens and the drafts before, and reports each q.
class PoorDrafter final : public Drafter {
 public:
  PoorDrafter(const SamplingParams& params, QReport report)
      : sampler_(params, kV), report_(report) {}
  std::string_view name() const override { return "poor"; }
  double relative_cost() const override { return 0.0; }
  Status Propose(std::span<const DraftRequest> requests, const KvCacheManager&,
                 std::span<Draft> drafts) override {
    for (size_t i = 0; i < requests.size(); ++i) {
      const Sequence& seq = *requests[i].seq;
      const SamplingParams& sp = seq.sampling.params;
      EXPECT_EQ(sp.top_k, sampler_.params().top_k);
      EXPECT_EQ(sp.repeat_penalty, sampler_.params().repeat_penalty);
      const std::span<const int32_t> history(seq.tokens.data(), seq.n_committed());
      Draft& d = drafts[i];
      d.tokens.clear();
      d.probs.clear();
      for (int32_t j = 0; j < requests[i].max_drafts; ++j) {
        const int32_t prev = j == 0 ? history.back() : d.tokens.back();
        const SampledToken st =
            sampler_.SampleWithDistribution(PoorDraft().Row(prev), history, d.tokens);
        d.tokens.push_back(st.token);
        d.probs.emplace_back(st.probs.begin(), st.probs.end());
        if (report_ == QReport::kFlattened) {
          for (TokenProb& tp : d.probs.back()) tp.p = 1.f / static_cast<float>(st.probs.size());
        }
      }
      ++proposals;
      ++by_k[std::min<int32_t>(requests[i].max_drafts, 3)];
    }
    return Status::Ok();
  }
  int64_t proposals = 0;
  int64_t by_k[4] = {0, 0, 0, 0};

 private:
  Sampler sampler_;
  QReport report_;
};

struct EngineResult {
  std::vector<int64_t> counts;  // joint of all max_tokens output tokens
  double acceptance = 0;
  int64_t proposals = 0;
  int64_t by_k[4] = {0, 0, 0, 0};
};

// n_requests requests of the prompt, one choice each with its own seed, max_tokens = n_out: the
// first output token is sampled after the prefill, the rest go through verification (k = n_out
// - 2 drafts first: the drafts and the token after them must fit max_tokens; fewer after a
// rejection as max_tokens nears).
EngineResult RunEngine(const SamplingParams& params, int32_t n_out, int64_t n_requests,
                       QReport report) {
  EngineConfig config;
  config.n_ctx = 64;
  config.block_size = 16;
  config.max_seqs = 64;
  config.n_blocks = 2 * config.max_seqs + 8;
  config.max_batch_tokens = 1024;
  config.watermark_blocks = 0;
  config.spec.draft_max = 3;
  config.spec.draft_min = 3;  // always the most drafts that fit max_tokens
  config.spec.compute_bound_tokens = 1 << 20;
  BigramRunner runner;
  SamplingParams dp = params;
  dp.seed = 0xD4AF7;
  PoorDrafter drafter(dp, report);
  Engine e(config, runner, &drafter);
  EngineResult r;
  r.counts.assign(static_cast<size_t>(std::pow(kV, n_out)), 0);
  std::vector<std::vector<int32_t>> out(n_requests);
  int64_t submitted = 0, live = 0;
  EngineStepStats stats;
  while (submitted < n_requests || e.HasWork()) {
    // Twice the running seats in flight: a short waiting list, full batches.
    for (; submitted < n_requests && live < 2 * config.max_seqs; ++submitted, ++live) {
      RequestOptions o;
      o.sampling = params;
      o.sampling.seed = 1000003ull * (submitted + 1);
      o.max_tokens = n_out;
      std::vector<int32_t>* sink = &out[submitted];
      auto id = e.Submit(kPrompt, o, [sink, &live](const TokenEvent& ev) {
        if (ev.token >= 0) sink->push_back(ev.token);
        if (ev.finished) --live;
      });
      EXPECT_TRUE(id.ok()) << id.error();
    }
    const Status st = e.Step(&stats);
    EXPECT_TRUE(st.ok()) << st.message();
    if (!st.ok()) break;
  }
  for (const std::vector<int32_t>& o : out) {
    EXPECT_EQ(static_cast<int32_t>(o.size()), n_out);
    if (static_cast<int32_t>(o.size()) != n_out) continue;
    size_t index = 0;
    for (int32_t t : o) index = index * kV + t;
    ++r.counts[index];
  }
  r.acceptance = static_cast<double>(stats.spec_accepted_tokens) / stats.spec_draft_tokens;
  r.proposals = drafter.proposals;
  std::copy(std::begin(drafter.by_k), std::end(drafter.by_k), r.by_k);
  return r;
}

constexpr int64_t kEngineRequests = 100000;

struct EngineCase {
  const char* name;
  SamplingParams params;
};

std::vector<EngineCase> EngineCases() {
  return {{"engine: top-k 5, top-p 0.9, 4 tokens", Params()},
          {"engine: + repeat 1.3, presence 0.5, 4 tokens", Params(1.3f, 0.5f)}};
}

TEST(SpecDistribution, EngineEmitsTheTargetsJoint) {
  for (const EngineCase& c : EngineCases()) {
    const auto t0 = std::chrono::steady_clock::now();
    const int32_t n_out = 4;
    const EngineResult r = RunEngine(c.params, n_out, kEngineRequests, QReport::kTruth);
    const Fit f = ChiSquare(r.counts, ExactJoint(c.params, kPrompt, n_out));
    PrintFit(c.name, f, r.acceptance);
    std::printf("    proposals %lld (k=1: %lld, k=2: %lld), %.2f s\n",
                static_cast<long long>(r.proposals), static_cast<long long>(r.by_k[1]),
                static_cast<long long>(r.by_k[2]),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    EXPECT_GE(r.proposals, kEngineRequests) << c.name;  // every request verified drafts
    EXPECT_GT(r.by_k[2], kEngineRequests / 2) << c.name;
    EXPECT_LT(r.acceptance, 0.7) << c.name;
    EXPECT_GT(r.acceptance, 0.2) << c.name;
    EXPECT_GT(f.df, 10) << c.name;
    EXPECT_EQ(f.impossible, 0) << c.name;
    EXPECT_LT(f.chi2, f.threshold) << c.name;
    EXPECT_LT(f.tv, f.tv_bound) << c.name;
  }
}

// The engine-level negative control: the same run with a drafter whose reported q is not what
// it drew from must fail the same statistic.
TEST(SpecDistribution, EngineWithAMisreportedDraftFailsTheSameTest) {
  for (const EngineCase& c : EngineCases()) {
    const int32_t n_out = 4;
    const EngineResult r = RunEngine(c.params, n_out, kEngineRequests, QReport::kFlattened);
    const Fit f = ChiSquare(r.counts, ExactJoint(c.params, kPrompt, n_out));
    PrintFit(c.name, f, r.acceptance);
    EXPECT_GT(f.chi2, 2 * f.threshold) << c.name;
    EXPECT_GT(f.tv, 2 * f.tv_bound) << c.name;
  }
}

}  // namespace
}  // namespace kvs
