// The sampler against its scalar twin: the algorithm as it was before it stopped copying the
// logits and sorting all of them (a copy of n_vocab logits, the penalties applied to it, every
// candidate sorted). Over random logits (ties, -inf, large vocabularies), penalty windows,
// drafts in flight and every combination of the cuts, both must draw the same tokens and publish
// bit-identical distributions.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <random>

#include "engine/sampler.h"

namespace kvs {
namespace {

// The sampler before the change, trimmed to what Process and the draw did.
class ReferenceSampler {
 public:
  ReferenceSampler(const SamplingParams& params, int32_t n_vocab)
      : params_(params), n_vocab_(n_vocab), rng_(params.seed), counts_(n_vocab, 0) {}

  // {token, distribution} as SampleWithDistribution returns them.
  std::pair<int32_t, std::vector<TokenProb>> Sample(const float* logits,
                                                    std::span<const int32_t> history,
                                                    std::span<const int32_t> in_flight) {
    Process(logits, history, in_flight);
    int32_t token = candidates_[0].id;
    if (params_.temperature > 0.f) {
      double r = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * total_;
      token = candidates_[keep_ - 1].id;
      for (size_t i = 0; i < keep_; ++i) {
        r -= weights_[i];
        if (r < 0) {
          token = candidates_[i].id;
          break;
        }
      }
    }
    std::vector<TokenProb> probs(keep_);
    for (size_t i = 0; i < keep_; ++i) {
      probs[i] = {candidates_[i].id, static_cast<float>(weights_[i] / total_)};
    }
    return {token, probs};
  }

 private:
  struct Candidate {
    int32_t id;
    float logit;
  };

  void ApplyPenalties(std::span<float> logits, std::span<const int32_t> history,
                      std::span<const int32_t> in_flight) {
    const bool any = params_.repeat_penalty != 1.f || params_.frequency_penalty != 0.f ||
                     params_.presence_penalty != 0.f;
    const size_t n = history.size() + in_flight.size();
    if (!any || n == 0 || params_.repeat_last_n == 0) return;
    const size_t window =
        params_.repeat_last_n < 0 ? n : std::min<size_t>(n, params_.repeat_last_n);
    const size_t from_flight = std::min(window, in_flight.size());
    const std::span<const int32_t> parts[] = {
        history.subspan(history.size() - (window - from_flight)),
        in_flight.subspan(in_flight.size() - from_flight)};
    for (std::span<const int32_t> part : parts) {
      for (int32_t t : part) {
        if (t >= 0 && t < n_vocab_) ++counts_[t];
      }
    }
    for (std::span<const int32_t> part : parts) {
      for (int32_t t : part) {
        if (t < 0 || t >= n_vocab_ || counts_[t] == 0) continue;
        float& l = logits[t];
        if (params_.repeat_penalty != 1.f)
          l = l > 0 ? l / params_.repeat_penalty : l * params_.repeat_penalty;
        l -= counts_[t] * params_.frequency_penalty + params_.presence_penalty;
        counts_[t] = 0;
      }
    }
  }

  void Process(const float* logits, std::span<const int32_t> history,
               std::span<const int32_t> in_flight) {
    work_.assign(logits, logits + n_vocab_);
    ApplyPenalties(work_, history, in_flight);
    if (params_.temperature <= 0.f) {
      const int32_t best = ArgMax(work_.data(), n_vocab_);
      candidates_.assign(1, {best, work_[best]});
      weights_.assign(1, 1.0);
      keep_ = 1;
      total_ = 1.0;
      return;
    }
    candidates_.resize(n_vocab_);
    for (int32_t i = 0; i < n_vocab_; ++i) candidates_[i] = {i, work_[i]};
    auto by_logit = [](const Candidate& a, const Candidate& b) {
      return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
    };
    size_t keep = candidates_.size();
    if (params_.top_k > 0 && static_cast<size_t>(params_.top_k) < keep) {
      keep = params_.top_k;
      std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(),
                        by_logit);
    } else {
      std::sort(candidates_.begin(), candidates_.end(), by_logit);
    }
    candidates_.resize(keep);
    Cut(keep);
  }

  void Cut(size_t keep) {
    std::vector<double>& probs = weights_;
    probs.resize(keep);
    const double max_logit = candidates_[0].logit;
    double sum = 0;
    for (size_t i = 0; i < keep; ++i) sum += probs[i] = std::exp(candidates_[i].logit - max_logit);
    if (params_.top_p < 1.f) {
      double cum = 0;
      size_t cut = keep;
      for (size_t i = 0; i < keep; ++i) {
        cum += probs[i] / sum;
        if (cum >= params_.top_p) {
          cut = i + 1;
          break;
        }
      }
      keep = cut;
    }
    if (params_.min_p > 0.f) {
      size_t cut = 1;
      while (cut < keep && probs[cut] >= params_.min_p * probs[0]) ++cut;
      keep = cut;
    }
    double total = 0;
    for (size_t i = 0; i < keep; ++i) {
      probs[i] = std::exp((candidates_[i].logit - max_logit) / params_.temperature);
      total += probs[i];
    }
    while (keep > 1 && static_cast<float>(probs[keep - 1] / total) == 0) --keep;
    keep_ = keep;
    total_ = total;
  }

  SamplingParams params_;
  int32_t n_vocab_;
  std::mt19937_64 rng_;
  std::vector<float> work_;
  std::vector<Candidate> candidates_;
  std::vector<double> weights_;
  std::vector<int32_t> counts_;
  size_t keep_ = 0;
  double total_ = 0;
};

// Random logits of one of several shapes: spread normal logits, coarse ones full of ties, and
// ones with -inf entries (a grammar's masked tokens).
std::vector<float> RandomLogits(std::mt19937_64& rng, int32_t n, int shape) {
  std::normal_distribution<float> normal(0.f, shape == 0 ? 3.f : 8.f);
  std::vector<float> l(n);
  for (float& x : l) x = normal(rng);
  if (shape == 1) {
    for (float& x : l) x = std::round(x);  // many equal logits: the id tie rule decides
  }
  if (shape == 2) {
    std::uniform_int_distribution<int32_t> pick(0, n - 1);
    for (int i = 0; i < n / 3; ++i) l[pick(rng)] = -std::numeric_limits<float>::infinity();
  }
  return l;
}

SamplingParams RandomParams(std::mt19937_64& rng, int32_t n_vocab) {
  const float temps[] = {0.f, 0.01f, 0.3f, 0.8f, 1.f, 2.5f};
  const int32_t top_ks[] = {0, 1, 2, 5, 40, n_vocab - 1, n_vocab, n_vocab + 3};
  const float top_ps[] = {1.f, 0.99f, 0.95f, 0.5f, 0.f};
  const float min_ps[] = {0.f, 0.001f, 0.05f, 0.5f, 1.f};
  auto pick = [&](auto& array) {
    return array[std::uniform_int_distribution<size_t>(0, std::size(array) - 1)(rng)];
  };
  SamplingParams p;
  p.temperature = pick(temps);
  p.top_k = std::max(0, pick(top_ks));
  p.top_p = pick(top_ps);
  p.min_p = pick(min_ps);
  if (rng() % 2) {
    p.repeat_penalty = 1.3f;
    p.frequency_penalty = 0.4f;
    p.presence_penalty = 0.2f;
    const int32_t last_n[] = {-1, 0, 1, 8, 64};
    p.repeat_last_n = pick(last_n);
  }
  p.seed = rng();
  return p;
}

TEST(SamplerTwin, DrawsAndDistributionsMatchTheReferenceBitForBit) {
  std::mt19937_64 rng(20261207);
  int cases = 0;
  for (int32_t n_vocab : {1, 2, 3, 17, 100, 1000, 32000}) {
    const int settings = n_vocab >= 32000 ? 12 : 60;
    for (int s = 0; s < settings; ++s, ++cases) {
      const SamplingParams p = RandomParams(rng, n_vocab);
      SCOPED_TRACE(::testing::Message()
                   << "n_vocab " << n_vocab << " temperature " << p.temperature << " top_k "
                   << p.top_k << " top_p " << p.top_p << " min_p " << p.min_p << " penalty "
                   << p.repeat_penalty << " last_n " << p.repeat_last_n << " shape " << s % 3);
      Sampler fast(p, n_vocab);
      ReferenceSampler twin(p, n_vocab);
      std::vector<int32_t> history;
      for (int i = 0; i < 5; ++i) history.push_back(static_cast<int32_t>(rng() % n_vocab));
      for (int step = 0; step < 12; ++step) {
        const std::vector<float> logits = RandomLogits(rng, n_vocab, s % 3);
        // Now and then a draft in flight, penalized as if appended.
        std::vector<int32_t> in_flight;
        if (step % 4 == 3) in_flight = {history.front(), static_cast<int32_t>(rng() % n_vocab)};
        const auto [want, want_probs] = twin.Sample(logits.data(), history, in_flight);
        const SampledToken got = fast.SampleWithDistribution(logits.data(), history, in_flight);
        ASSERT_EQ(got.token, want) << "step " << step;
        ASSERT_EQ(got.probs.size(), want_probs.size()) << "step " << step;
        for (size_t i = 0; i < want_probs.size(); ++i) {
          ASSERT_EQ(got.probs[i].id, want_probs[i].id) << "step " << step << " rank " << i;
          // Bit for bit: the same arithmetic in the same order.
          ASSERT_EQ(std::bit_cast<uint32_t>(got.probs[i].p),
                    std::bit_cast<uint32_t>(want_probs[i].p))
              << "step " << step << " rank " << i;
        }
        history.push_back(want);
      }
    }
  }
  EXPECT_GT(cases, 300);
}

// Greedy's scan without the copy keeps ArgMax's rule: the first of the largest, and a NaN at
// token 0 is never displaced (nothing compares greater than it).
TEST(SamplerTwin, GreedyKeepsArgMaxsTieAndNanRule) {
  SamplingParams p;
  p.temperature = 0;
  p.repeat_penalty = 2.f;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<std::vector<float>> cases = {
      {1.f, 3.f, 3.f, 2.f}, {nan, 5.f, 1.f}, {1.f, nan, 5.f, 5.f}, {4.f, 2.f, 8.f, 8.f}};
  for (const std::vector<float>& l : cases) {
    for (const std::vector<int32_t>& history : {std::vector<int32_t>{}, {2}, {0, 3}}) {
      Sampler fast(p, static_cast<int32_t>(l.size()));
      ReferenceSampler twin(p, static_cast<int32_t>(l.size()));
      EXPECT_EQ(fast.Sample(l.data(), history), twin.Sample(l.data(), history, {}).first);
    }
  }
}

}  // namespace
}  // namespace kvs
