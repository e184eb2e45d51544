// One prefill of a calibration text, from position 0, into a plain f32 KV cache of its own:
// what the calibrations read (key codings' keys, tri's queries, the transform fit's keys and
// values). CalibrationRuns keeps the last one, so calibrations of the same tokens (by default
// all three use the built-in paragraph) share one forward pass instead of each running it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "kv/kv_storage.h"
#include "model/weights.h"

namespace kvs {

class CalibrationPrefill {
 public:
  // Prefills tokens (at least one, each in the vocabulary) from position 0; with_queries keeps
  // every layer's queries as the forward pass made them (after RoPE).
  static Expected<std::shared_ptr<const CalibrationPrefill>> Run(const Model& model,
                                                                 ThreadPool& pool,
                                                                 std::span<const int32_t> tokens,
                                                                 bool with_queries);

  int32_t n_tokens() const { return static_cast<int32_t>(tokens_.size()); }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  const KvStorage& storage() const { return *storage_; }
  // The kernel blocks holding slots 0.. (slot p holds position p).
  const std::vector<int32_t>& blocks() const { return blocks_; }
  bool has_queries() const { return !queries_.empty(); }
  // [n_tokens][n_head * head_dim] of layer l (has_queries()).
  const float* queries(int32_t layer) const {
    return queries_.data() + static_cast<size_t>(layer) * query_layer_floats_;
  }

 private:
  CalibrationPrefill() = default;

  std::vector<int32_t> tokens_;
  std::unique_ptr<KvStorage> storage_;
  std::vector<int32_t> blocks_;
  std::vector<float> queries_;  // [n_layer][n_tokens][n_head * head_dim]
  size_t query_layer_floats_ = 0;
};

// The last prefill of at most share_up_to tokens, reused when the same tokens are asked for
// again; it keeps its queries whether asked or not, so that a later calibration that wants them
// (tri's, on the built-in paragraph of at most 64 tokens) shares it. A longer text is not kept:
// its f32 K/V (and queries) would stay in memory beside the KV pool the engine allocates next
// (512 tokens of a 32-layer model with 4096-wide K/V are 512 MiB).
class CalibrationRuns {
 public:
  CalibrationRuns(const Model& model, ThreadPool& pool, int32_t share_up_to = 64)
      : model_(model), pool_(pool), share_up_to_(share_up_to) {}
  Expected<std::shared_ptr<const CalibrationPrefill>> Get(std::span<const int32_t> tokens,
                                                          bool with_queries);
  int32_t num_runs() const { return num_runs_; }  // forward passes made (tests)
  // Drops the kept prefill (the calibrations are done).
  void Clear() { last_ = nullptr; }

 private:
  const Model& model_;
  ThreadPool& pool_;
  int32_t share_up_to_;
  std::shared_ptr<const CalibrationPrefill> last_;
  int32_t num_runs_ = 0;
};

}  // namespace kvs
