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

void Sampler::ApplyPenalties(std::span<float> logits, std::span<const int32_t> history,
                             std::span<const int32_t> in_flight) {
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
      float& l = logits[t];
      if (params_.repeat_penalty != 1.f)
        l = l > 0 ? l / params_.repeat_penalty : l * params_.repeat_penalty;
      l -= counts[t] * params_.frequency_penalty + params_.presence_penalty;
      counts[t] = 0;  // each distinct token penalized once
    }
  }
}

void Sampler::Process(const float* logits, std::span<const int32_t> history,
                      std::span<const int32_t> in_flight) {
  work_.assign(logits, logits + n_vocab_);
  ApplyPenalties(work_, history, in_flight);
  if (params_.temperature <= 0.f) {
    const int32_t best = ArgMax(work_.data(), n_vocab_);
    candidates_.resize(1);
    candidates_[0] = {best, work_[best]};
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
    std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), by_logit);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }
  candidates_.resize(keep);

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
