// Token sampling: penalties, then top-k, top-p, min-p and temperature, then a draw.
// Temperature <= 0 means greedy (argmax, no randomness). Same seed, same output.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "core/status.h"

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

class Sampler {
 public:
  Sampler(const SamplingParams& params, int32_t n_vocab);

  // Picks the next token from logits[n_vocab]; `history` is the sequence so far (prompt and
  // generated), used by the penalties.
  int32_t Sample(const float* logits, std::span<const int32_t> history);

  // Applies the penalties to a copy of logits (exposed for tests).
  void ApplyPenalties(std::vector<float>& logits, std::span<const int32_t> history);

 private:
  struct Candidate {
    int32_t id;
    float logit;
  };

  SamplingParams params_;
  int32_t n_vocab_;
  std::mt19937_64 rng_;
  std::vector<float> work_;
  std::vector<Candidate> candidates_;
  std::vector<int32_t> counts_;
};

int32_t ArgMax(const float* logits, int32_t n);

}  // namespace kvs
