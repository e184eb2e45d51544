// Token sampling: penalties, then top-k, top-p, min-p and temperature, then a draw.
// Temperature <= 0 means greedy (argmax, no randomness). Same seed, same output.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "core/status.h"
#include "engine/top_k.h"

namespace kvs {

struct SamplingParams {
  float temperature = 0.8f;
  int32_t top_k = 40;           // <= 0: off
  float top_p = 0.95f;          // >= 1: off
  float min_p = 0.05f;          // <= 0: off
  float repeat_penalty = 1.0f;  // 1: off (llama.cpp's divide-positive / multiply-negative rule)
  int32_t repeat_last_n = 64;   // how many recent tokens the penalties look at (-1: all)
  float frequency_penalty = 0.f;
  float presence_penalty = 0.f;
  uint64_t seed = 0xC0FFEE;

  // Rejects absurd values with a message naming the parameter.
  Status Validate() const;
};

// One token of a processed distribution.
struct TokenProb {
  int32_t id;
  float p;
};

// A drawn token and the distribution it was drawn from. `probs` lists every token with non-zero
// probability after penalties, top-k, top-p, min-p and temperature, most likely first (ties by
// id), summing to 1; greedy is the argmax alone with p = 1. It points into the sampler and is
// valid until the sampler's next call.
struct SampledToken {
  int32_t token;
  std::span<const TokenProb> probs;
};

class Sampler {
 public:
  Sampler(const SamplingParams& params, int32_t n_vocab);

  const SamplingParams& params() const { return params_; }
  int32_t n_vocab() const { return n_vocab_; }

  // Picks the next token from logits[n_vocab]; `history` is the sequence so far (prompt and
  // generated), used by the penalties. `in_flight` are tokens after it that are not committed yet
  // (a speculative draft); the penalties treat them as appended to `history`.
  int32_t Sample(const float* logits, std::span<const int32_t> history,
                 std::span<const int32_t> in_flight = {});

  // Sample, also returning the distribution the token was drawn from. Same RNG use as Sample: for
  // the same seed and inputs both draw the same tokens.
  SampledToken SampleWithDistribution(const float* logits, std::span<const int32_t> history,
                                      std::span<const int32_t> in_flight = {});

  // The processed distribution without drawing (no RNG use), as in SampledToken; valid until the
  // sampler's next call.
  std::span<const TokenProb> Distribution(const float* logits, std::span<const int32_t> history,
                                          std::span<const int32_t> in_flight = {});

  // Draws a token from `probs` with weights proportional to p (they need not sum to 1, e.g. a
  // max(0, p - q) residual of speculative decoding); entries with p <= 0 are never drawn. One RNG
  // step. Returns -1 if `probs` holds no positive weight.
  int32_t Draw(std::span<const TokenProb> probs);

  // A uniform draw in [0, 1) from this sampler's RNG (one step), for accept/reject decisions.
  double Uniform();

  // Applies the penalties to logits[n_vocab] in place, `in_flight` counting as appended to
  // `history` (exposed for tests).
  void ApplyPenalties(std::span<float> logits, std::span<const int32_t> history,
                      std::span<const int32_t> in_flight = {});

 private:
  using Candidate = TokenLogit;

  // Leaves the surviving candidates in candidates_[0, keep_) with their unnormalized weights in
  // weights_ (sum total_); the draw and the published distribution both read these.
  void Process(const float* logits, std::span<const int32_t> history,
               std::span<const int32_t> in_flight);
  // The penalized logits of the tokens in the penalty window, by id, into penalized_: the
  // few logits the penalties change, so that nothing copies all n_vocab of them.
  void CollectPenalties(const float* logits, std::span<const int32_t> history,
                        std::span<const int32_t> in_flight);
  // Calls visit(id, logit) for every token in id order, penalized_'s logit in place of the raw
  // one where there is one.
  template <typename Visit>
  void ForEachLogit(const float* logits, Visit&& visit) const;
  float FirstLogit(const float* logits) const;  // token 0's, penalized
  // candidates_ holds, sorted most likely first (ties by id), the candidates the cuts can keep:
  // the top_k best, or those that pass min-p, or all. What each cut reads is the same as if every
  // candidate had been sorted, so the cuts' arithmetic, in its order, is unchanged.
  void SelectCandidates(const float* logits);
  void SelectTopK(const float* logits, size_t k);
  void SelectMinP(const float* logits);
  void SelectAll(const float* logits);
  int32_t DrawProcessed();
  std::span<const TokenProb> PublishProcessed();

  SamplingParams params_;
  int32_t n_vocab_;
  std::mt19937_64 rng_;
  // Scratch reused across calls so that sampling does not allocate once warm.
  std::vector<Candidate> penalized_;  // by id
  std::vector<Candidate> candidates_;
  std::vector<double> weights_;
  std::vector<TokenProb> probs_;
  std::vector<int32_t> counts_;
  size_t keep_ = 0;
  double total_ = 0;
};

int32_t ArgMax(const float* logits, int32_t n);

}  // namespace kvs
