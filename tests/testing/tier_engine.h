// An engine over the stories models with a disk tier, for the tier tests (kv_tier_test,
// transform_codec_test): a small pool, chunked prefill (loads and chunks interleave), the pool's
// invariants verified every step, and prompts served one at a time, greedy.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_builder.h"

namespace kvs::testing {

struct Served {
  std::vector<std::vector<int32_t>> tokens;  // [prompt][output token]
  std::vector<int32_t> disk_tokens;          // per prompt: loaded from disk
  KvTierStats tier;
};

class TierEngine {
 public:
  // dir "": no disk tier. tier: its settings (dir is set from dir).
  TierEngine(const Model& model, KvTypes types, const std::string& dir, int32_t n_blocks = 64,
             KvTierConfig tier = {});
  bool ok() const { return local_.engine != nullptr; }
  Engine& engine() { return *local_.engine; }

  // Each prompt alone (so that a later one may hit what an earlier one stored), 8 greedy tokens.
  Served Serve(const std::vector<std::vector<int32_t>>& prompts, const BlockHash& key = {});

 private:
  ThreadPool pool_;
  EngineBuilder builder_;
  LocalEngine local_;
};

}  // namespace kvs::testing
