// Token eviction in the engine (issue #19): when a sequence with a KV budget is due (the end of
// its prefill, then once it has grown a block past its budget or every --evict-every decode
// steps), its policy scores the cached slots, SelectKept keeps the sinks, the recent window and
// the best others up to the budget, the runner moves the kept slots forward (compaction), and
// the cache manager returns the whole blocks that came free. One place, used alike by the
// engine's steps and by `perplexity --kv-budget`, so that perplexity scores the cache that
// generation would have had.
//
// Sharing: blocks shared with another sequence (a fork's prompt, a prefix-cache hit still held
// by another request) are never rewritten; they are frozen, kept in place and counted against
// the budget. Blocks private to the sequence but in the prefix index leave the index before
// they are rewritten (KvCacheManager::Compact), and a compacted sequence never commits again.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/status.h"
#include "engine/eviction_config.h"
#include "engine/request.h"
#include "engine/step_runner.h"
#include "kv/eviction_policy.h"
#include "kv/kv_cache_manager.h"

namespace kvs {

// Where in a sequence's life a step left it.
enum class EvictionPoint {
  kPrefillChunk,  // a chunk of a long prompt (or of a recompute after preemption) is done
  kPrefillEnd,    // the prompt is computed: its logits sample the first token
  kDecode,        // a decode step
};

struct EvictionOutcome {
  int32_t evicted = 0;       // positions dropped
  int32_t blocks_freed = 0;  // whole blocks returned to the pool
  bool compacted = false;    // an eviction ran (something was dropped)
};

class Evictor {
 public:
  Evictor(const EvictionConfig& config, std::unique_ptr<EvictionPolicy> policy);

  const EvictionConfig& config() const { return config_; }
  const EvictionPolicy& policy() const { return *policy_; }

  // Sets up a new sequence: its budget (the request's, else the engine's) and whether the
  // runner must observe its attention.
  void Attach(Sequence* seq, const KvBudget& request_budget) const;
  // The observed queries of a run start here (tokens before it in the run are not observed):
  // the last kObservationWindow committed tokens, i.e. the end of the prompt and each decode.
  static int32_t FirstObservedToken(const Sequence& seq, int32_t first, int32_t n_tokens);

  // After a step computed tokens of seq (n_computed already advanced; its table holds
  // n_slots() slots): evicts when due. At the end of a prefill and after each chunk of a long
  // one (so that a long prompt never holds more than its budget and a chunk; not for policies
  // that score by the attention of the prompt's last tokens, which the last chunk brings), when
  // over the budget; in decode, once a block past it (or every --evict-every steps).
  Expected<EvictionOutcome> AfterStep(Sequence* seq, EvictionPoint point, KvCacheManager& kv,
                                      StepRunner& runner);
  // Evicts down to the budget now, whatever the schedule says.
  Expected<EvictionOutcome> Evict(Sequence* seq, KvCacheManager& kv, StepRunner& runner);

  // The most slots a sequence of `length` positions (prompt + output) can hold at once: what
  // admission must find room for.
  int32_t PeakSlots(const KvBudget& budget, int32_t n_prompt, int32_t length,
                    int32_t block_size) const;

 private:
  // The positions seq keeps now: its budget, at least its shared slots, sinks and window.
  int32_t Budget(const Sequence& seq, const KvCacheManager& kv) const;
  Status Score(const Sequence& seq, const BlockTable& table, StepRunner& runner,
               std::span<float> scores);

  EvictionConfig config_;
  std::unique_ptr<EvictionPolicy> policy_;
  std::vector<float> keys_, layer_scores_;  // scratch
};

}  // namespace kvs
