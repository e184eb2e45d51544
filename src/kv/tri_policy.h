// The tri eviction policy (TriAttention-style): a head's queries before RoPE gather around a
// fixed centre q̄, so the logit a future query at position t gives the key k written at position
// p is well predicted by q̄ᵀ R(p − t) k_pre — one trigonometric series in t − p per key. Keys are
// scored by that predicted logit averaged over a fixed set of future offsets: no attention
// matrix, no observed queries, only the keys and a calibration measured once per model
// (engine/query_centres.h).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "kv/eviction_policy.h"

namespace kvs {

// What the tri policy knows of a model: its RoPE and each (layer, query head)'s mean query
// before RoPE.
struct TriCalibration {
  int32_t n_layer = 0;
  int32_t n_head = 0;
  int32_t n_head_kv = 0;
  int32_t head_dim = 0;  // head_dim_k
  int32_t n_rot = 0;     // dims RoPE turns (even, <= head_dim); the rest are not turned
  bool rope_neox = false;
  // [n_rot/2] the angle pair i (RopePairDims) turns by per position, freq_scale and the model's
  // rope_freqs included: a key at position p is its pre-RoPE self turned by p * theta[i].
  std::vector<float> theta;
  std::vector<float> query_mean;  // [n_layer][n_head][head_dim] pre-RoPE

  // Error unless the shapes agree (n_head a multiple of n_head_kv, vectors of their sizes) and
  // every value is finite.
  Status Validate() const;
};

// Scores each slot of one layer by the logit the calibrated mean queries are predicted to give
// its key at the future positions n_positions + d, d in kFutureOffsets, averaged over d and
// scaled by 1/sqrt(head_dim); per KV head the max over its group's query heads, z-scored over
// the slots, then averaged over KV heads. A slot with a non-finite key scores NaN.
class TriPolicy final : public EvictionPolicy {
 public:
  // Geometric, so that near and far futures weigh alike per octave: 1, 2, 4, ..., 4096.
  static constexpr std::array<int32_t, 13> kFutureOffsets = {1,   2,   4,   8,    16,   32,  64,
                                                             128, 256, 512, 1024, 2048, 4096};

  // A calibration that fails Validate (or none) makes every Score an error saying so.
  explicit TriPolicy(std::shared_ptr<const TriCalibration> calibration);

  std::string_view name() const override { return "tri"; }
  bool needs_keys() const override { return true; }
  Status Score(const EvictionInput& input, std::span<float> scores) const override;

 private:
  std::shared_ptr<const TriCalibration> calibration_;
  Status valid_;  // calibration_->Validate(), once
};

}  // namespace kvs
