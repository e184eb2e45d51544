#include "engine/sampler.h"

#include <algorithm>
#include <cmath>

namespace kvs {

Status SamplingParams::Validate() const {
  if (!std::isfinite(temperature) || temperature < 0 || temperature > 100) {
    return Status::Error(StrFormat("temperature %g is out of range [0, 100]", temperature));
  }
  if (!(top_p >= 0 && top_p <= 1))
    return Status::Error(StrFormat("top_p %g is out of range [0, 1]", top_p));
  if (!(min_p >= 0 && min_p <= 1))
    return Status::Error(StrFormat("min_p %g is out of range [0, 1]", min_p));
  if (!(repeat_penalty > 0 && repeat_penalty <= 100)) {
    return Status::Error(StrFormat("repeat_penalty %g is out of range (0, 100]", repeat_penalty));
  }
  if (!(std::fabs(frequency_penalty) <= 100)) {
    return Status::Error(
        StrFormat("frequency_penalty %g is out of range [-100, 100]", frequency_penalty));
  }
  if (!(std::fabs(presence_penalty) <= 100)) {
    return Status::Error(
        StrFormat("presence_penalty %g is out of range [-100, 100]", presence_penalty));
  }
  if (repeat_last_n < -1) return Status::Error("repeat_last_n must be -1 (all) or >= 0");
  return Status::Ok();
}

int32_t ArgMax(const float* logits, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

Sampler::Sampler(const SamplingParams& params, int32_t n_vocab)
    : params_(params), n_vocab_(n_vocab), rng_(params.seed), counts_(n_vocab, 0) {}

void Sampler::CollectPenalties(const float* logits, std::span<const int32_t> history,
                               std::span<const int32_t> in_flight) {
  penalized_.clear();
  const bool any = params_.repeat_penalty != 1.f || params_.frequency_penalty != 0.f ||
                   params_.presence_penalty != 0.f;
  const size_t n = history.size() + in_flight.size();
  if (!any || n == 0 || params_.repeat_last_n == 0) return;
  // The window is the last repeat_last_n of history + in_flight, taken from both without
  // building the concatenation.
  const size_t window = params_.repeat_last_n < 0 ? n : std::min<size_t>(n, params_.repeat_last_n);
  const size_t from_flight = std::min(window, in_flight.size());
  const std::span<const int32_t> parts[] = {
      history.subspan(history.size() - (window - from_flight)),
      in_flight.subspan(in_flight.size() - from_flight)};
  std::vector<int32_t>& counts = counts_;  // all zero between calls
  for (std::span<const int32_t> part : parts) {
    for (int32_t t : part) {
      if (t >= 0 && t < n_vocab_) ++counts[t];
    }
  }
  for (std::span<const int32_t> part : parts) {
    for (int32_t t : part) {
      if (t < 0 || t >= n_vocab_ || counts[t] == 0) continue;
      float l = logits[t];
      if (params_.repeat_penalty != 1.f)
        l = l > 0 ? l / params_.repeat_penalty : l * params_.repeat_penalty;
      l -= counts[t] * params_.frequency_penalty + params_.presence_penalty;
      penalized_.push_back({t, l});
      counts[t] = 0;  // each distinct token penalized once
    }
  }
  std::sort(penalized_.begin(), penalized_.end(),
            [](const Candidate& a, const Candidate& b) { return a.id < b.id; });
}

void Sampler::ApplyPenalties(std::span<float> logits, std::span<const int32_t> history,
                             std::span<const int32_t> in_flight) {
  CollectPenalties(logits.data(), history, in_flight);
  for (const Candidate& c : penalized_) logits[c.id] = c.logit;
}

float Sampler::FirstLogit(const float* logits) const {
  return !penalized_.empty() && penalized_[0].id == 0 ? penalized_[0].logit : logits[0];
}

template <typename Visit>
void Sampler::ForEachLogit(const float* logits, Visit&& visit) const {
  int32_t from = 0;
  for (const Candidate& c : penalized_) {
    for (int32_t i = from; i < c.id; ++i) visit(i, logits[i]);
    visit(c.id, c.logit);
    from = c.id + 1;
  }
  for (int32_t i = from; i < n_vocab_; ++i) visit(i, logits[i]);
}

void Sampler::SelectTopK(const float* logits, size_t k) {
  TopKInIdOrder(
      k, [&](auto visit) { ForEachLogit(logits, visit); }, &candidates_);
}

void Sampler::SelectMinP(const float* logits) {
  // Without top-k and top-p, the cuts keep the best candidate and every one whose weight
  // exp(logit - max) passes min-p's test; weights fall with the logits, so that is the prefix
  // the cut finds in the sorted list. A logit far below the bar skips the exp; near it the test
  // is the cut's own expression.
  Candidate best{0, FirstLogit(logits)};
  ForEachLogit(logits, [&](int32_t id, float logit) {
    if (MoreLikely(Candidate{id, logit}, best)) best = {id, logit};
  });
  const double max_logit = best.logit;
  const double p0 = std::exp(best.logit - max_logit);
  const double bar = params_.min_p * p0;
  const double screen = std::log(bar) - 1e-6;  // NaN when bar is: then only best is kept
  candidates_.clear();
  candidates_.push_back(best);
  ForEachLogit(logits, [&](int32_t id, float logit) {
    if (id != best.id && logit - max_logit >= screen && std::exp(logit - max_logit) >= bar) {
      candidates_.push_back({id, logit});
    }
  });
  std::sort(candidates_.begin(), candidates_.end(), MoreLikely);
}

void Sampler::SelectAll(const float* logits) {
  candidates_.resize(n_vocab_);
  ForEachLogit(logits, [&](int32_t id, float logit) { candidates_[id] = {id, logit}; });
  std::sort(candidates_.begin(), candidates_.end(), MoreLikely);
}

void Sampler::SelectCandidates(const float* logits) {
  if (params_.top_k > 0 && params_.top_k < n_vocab_) {
    SelectTopK(logits, static_cast<size_t>(params_.top_k));
  } else if (params_.top_p >= 1.f && params_.min_p > 0.f) {
    SelectMinP(logits);
  } else {
    // top-p sums every weight in sorted order (floating-point addition is not associative), and
    // without any cut every token is a candidate: both need the whole sorted list.
    SelectAll(logits);
  }
}

void Sampler::Process(const float* logits, std::span<const int32_t> history,
                      std::span<const int32_t> in_flight) {
  CollectPenalties(logits, history, in_flight);
  if (params_.temperature <= 0.f) {
    // ArgMax's scan over the penalized logits: the first of the largest (a NaN at 0 stays).
    int32_t best = 0;
    float best_logit = FirstLogit(logits);
    ForEachLogit(logits, [&](int32_t id, float logit) {
      if (logit > best_logit) {
        best_logit = logit;
        best = id;
      }
    });
    candidates_.resize(1);
    candidates_[0] = {best, best_logit};
    weights_.assign(1, 1.0);
    keep_ = 1;
    total_ = 1.0;
    return;
  }

  SelectCandidates(logits);
  size_t keep = candidates_.size();

  // Probabilities at temperature 1 decide top-p and min-p, as llama.cpp's default chain does;
  // temperature then reshapes the survivors.
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
    size_t cut = 1;  // probs[0] is the max; always keep it
    while (cut < keep && probs[cut] >= params_.min_p * probs[0]) ++cut;
    keep = cut;
  }

  double total = 0;
  for (size_t i = 0; i < keep; ++i) {
    probs[i] = std::exp((candidates_[i].logit - max_logit) / params_.temperature);
    total += probs[i];
  }
  // At a low temperature the tail's probabilities can round to 0 as floats (weights fall with the
  // logits, so these are a suffix). They go, so that the distribution lists only tokens with
  // p > 0 and every token drawn is listed. The total keeps their weight, so the draw's arithmetic
  // is unchanged: after exact subtractions r is 0 or far above such a weight, so only a draw
  // landing exactly on the last listed token's end (or the rounding fallback) differs, now taking
  // the last listed token instead of one with p = 0.
  while (keep > 1 && static_cast<float>(probs[keep - 1] / total) == 0) --keep;
  keep_ = keep;
  total_ = total;
}

double Sampler::Uniform() {
  // 53 random bits -> [0, 1): portable, unlike std::uniform_real_distribution.
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;
}

int32_t Sampler::DrawProcessed() {
  if (params_.temperature <= 0.f) return candidates_[0].id;  // greedy uses no randomness
  double r = Uniform() * total_;
  for (size_t i = 0; i < keep_; ++i) {
    r -= weights_[i];
    if (r < 0) return candidates_[i].id;
  }
  return candidates_[keep_ - 1].id;
}

std::span<const TokenProb> Sampler::PublishProcessed() {
  // Each p is the float nearest the weight the draw uses, so the draw follows this list up to
  // float rounding.
  probs_.resize(keep_);
  for (size_t i = 0; i < keep_; ++i) {
    probs_[i] = {candidates_[i].id, static_cast<float>(weights_[i] / total_)};
  }
  return probs_;
}

int32_t Sampler::Sample(const float* logits, std::span<const int32_t> history,
                        std::span<const int32_t> in_flight) {
  Process(logits, history, in_flight);
  return DrawProcessed();
}

SampledToken Sampler::SampleWithDistribution(const float* logits, std::span<const int32_t> history,
                                             std::span<const int32_t> in_flight) {
  Process(logits, history, in_flight);
  const int32_t token = DrawProcessed();
  return {token, PublishProcessed()};
}

std::span<const TokenProb> Sampler::Distribution(const float* logits,
                                                 std::span<const int32_t> history,
                                                 std::span<const int32_t> in_flight) {
  Process(logits, history, in_flight);
  return PublishProcessed();
}

int32_t Sampler::Draw(std::span<const TokenProb> probs) {
  double total = 0;
  for (const TokenProb& tp : probs) {
    if (tp.p > 0) total += tp.p;
  }
  double r = Uniform() * total;
  int32_t last = -1;
  for (const TokenProb& tp : probs) {
    if (!(tp.p > 0)) continue;
    last = tp.id;
    r -= tp.p;
    if (r < 0) return tp.id;
  }
  return last;  // rounding left r >= 0 past the end: the last positive entry (-1 if none)
}

}  // namespace kvs
