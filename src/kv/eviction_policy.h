// Token eviction, the policy half (issue #19): a policy scores a sequence's cached slots, and
// SelectKept keeps the attention sinks, the most recent window and the best-scored others up to
// the budget. One kept set serves every KV head (one block table for all heads), so per-head
// scores are pooled into one score per slot. Compaction (compaction.h) then moves the kept
// slots forward and frees whole blocks. Bookkeeping and light arithmetic only: the engine
// gathers what a policy reads (keys, attention mass) and hands it over.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace kvs {

// Slots that are never evicted: the first `sink` (attention sinks) and the last `window`.
struct EvictionGuard {
  int32_t sink = 4;     // --kv-sink
  int32_t window = 32;  // --kv-window
};

// Queries at the end of a prompt whose attention h2o and snapkv observe (SnapKV's window).
inline constexpr int32_t kObservationWindow = 32;

// What a policy may read of one sequence's cached slots. Policies that read keys are asked once
// per layer (keys and layer set) and the caller averages their scores over the layers.
struct EvictionInput {
  int32_t n_slots = 0;
  std::span<const int32_t> positions;  // [n_slots] each slot's RoPE position
  // [n_slots][n_head_kv][head_dim] keys as the model wrote them (after RoPE), for policies that
  // read keys (EvictionPolicy::needs_keys); empty otherwise.
  std::span<const float> keys;
  int32_t n_head_kv = 0;
  int32_t head_dim = 0;
  // [n_slots] the attention each slot received, summed over the queries and heads the engine
  // observed (AttentionMass), for policies that read it (needs_attention); empty otherwise.
  std::span<const float> attention_mass;
  int32_t n_positions = 0;  // the sequence's length: the position of its next token
  int32_t layer = 0;        // the layer of `keys`
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual std::string_view name() const = 0;
  virtual bool needs_keys() const { return false; }
  virtual bool needs_attention() const { return false; }
  // scores[n_slots]: higher is kept first. Sinks and window are kept whatever their score.
  virtual Status Score(const EvictionInput& input, std::span<float> scores) const = 0;
};

// StreamingLLM: the sinks and the most recent positions; scores are the positions.
class StreamingPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "streaming"; }
  Status Score(const EvictionInput& input, std::span<float> scores) const override;
};

// KeyDiff (attention-free): keep the keys least like the sequence's mean key. Per head, a
// slot's score is 1 - cos(key, mean key over the slots); pooled over heads by the mean.
class KeyDiffPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "keydiff"; }
  bool needs_keys() const override { return true; }
  Status Score(const EvictionInput& input, std::span<float> scores) const override;
};

// H2O (heavy hitters): keep the slots that received the most attention, accumulated over the
// queries observed (decode steps).
class H2oPolicy final : public EvictionPolicy {
 public:
  std::string_view name() const override { return "h2o"; }
  bool needs_attention() const override { return true; }
  Status Score(const EvictionInput& input, std::span<float> scores) const override;
};

// SnapKV: the attention an observation window of the last prompt tokens gave each slot, pooled
// over neighbouring slots (a centred average of kPool), so that kept keys come with context.
class SnapKvPolicy final : public EvictionPolicy {
 public:
  static constexpr int32_t kPool = 7;
  std::string_view name() const override { return "snapkv"; }
  bool needs_attention() const override { return true; }
  Status Score(const EvictionInput& input, std::span<float> scores) const override;
};

struct TriCalibration;  // kv/tri_policy.h

// --evict-policy NAME -> the policy; an unknown name is an error listing the known ones. "tri"
// needs the model's calibration (engine/query_centres.h: MeasureTriCalibration); without one,
// or with one that fails TriCalibration::Validate, it is an error.
Expected<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(
    std::string_view name, std::shared_ptr<const TriCalibration> tri = nullptr);

// The slots to keep, ascending: slots below `frozen` (shared with other sequences or the
// prefix cache: never rewritten), the sinks, the last guard.window, and the best-scored others
// (ties: the later slot) until `budget` are kept. budget >= n_slots keeps everything. Errors:
// a budget below sink + window, or a frozen prefix larger than the budget.
Expected<std::vector<int32_t>> SelectKept(std::span<const float> scores, int32_t budget,
                                          const EvictionGuard& guard, int32_t frozen = 0);

}  // namespace kvs
