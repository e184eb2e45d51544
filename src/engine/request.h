// Requests and the sequences they run as. A request with n choices starts as one sequence;
// when its prompt is computed it forks into n that share the prompt's blocks.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/ids.h"
#include "engine/eviction_config.h"
#include "engine/sampler.h"
#include "engine/spec/spec_policy.h"
#include "engine/step_batch.h"
#include "kv/kv_cache_manager.h"

namespace kvs {

using RequestId = int64_t;

// The most tiers under the RAM pool one engine asks (engine/kv_tier.h); sequences and events
// keep a fixed array per tier, indexed by the tier's place in the engine's list.
inline constexpr int kMaxTiers = 4;

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };
const char* FinishReasonName(FinishReason reason);  // "stop", "length", "cancelled", "error"

struct RequestOptions {
  SamplingParams sampling;
  int32_t max_tokens = 128;  // per choice; -1: until a stop token or the context is full
  std::vector<int32_t> stop_ids;
  int32_t n = 1;            // choices, forked from one prefill; choice i samples with seed + i
  int32_t priority = 0;     // higher runs first; first come, first served within a priority
  BlockHash cache_key;      // prefix-cache extra key: model, KV types, cache_salt (PrefixCacheKey)
  int32_t logprobs = -1;    // >= 0: report the chosen token's log-probability and this many
                            // most likely alternatives (of the model's distribution, before
                            // sampling's penalties and temperature)
  bool speculative = true;  // false: this request never drafts (the request field
                            // "speculative": false), whatever the engine's --spec-type
  KvBudget kv_budget;       // the request field kv_budget; unset: the engine's --kv-budget
};

// One streamed event: a new token of a choice, or its end (token -1 when it ended without
// one: cancelled, or an error).
struct TokenEvent {
  RequestId request = 0;
  int32_t choice = 0;
  int32_t token = -1;
  bool finished = false;
  FinishReason reason = FinishReason::kNone;
  std::string error;  // for kError
  float logprob = 0;  // when RequestOptions::logprobs >= 0
  std::vector<TokenLogprob> top_logprobs;
  int32_t cached_tokens = 0;  // prompt tokens served from the prefix cache
  // Of those, the ones each tier loaded for this request, by the tier's place in the engine's
  // list (Engine::tiers()); a fixed array: an event is made per token, without allocating.
  std::array<int32_t, kMaxTiers> tier_tokens{};
};
using TokenCallback = std::function<void(const TokenEvent&)>;

// Sequence lifecycle: kWaiting (queued, or preempted with its blocks freed) -> kRunning (has
// blocks, scheduled every step) -> kFinished. Preemption sends a running sequence back to
// kWaiting with n_computed = 0; it keeps its tokens and recomputes them when readmitted.
enum class SeqState { kWaiting, kRunning, kFinished };

// A sequence's tokens, front to back:
//   [0, n_computed)                K/V in the cache
//   [n_computed, n_committed())    accepted tokens still to compute: the rest of the prompt
//                                  (a prefill), or the one token sampled last (a decode)
//   [n_committed(), tokens.size()) n_in_flight draft tokens: computed with the last committed
//                                  token to be verified, then kept or truncated away
// Drafts never count as output, never make a run a prefill, and are never hashed into the
// prefix cache. They live for one step: the engine adds lookahead placeholders before planning,
// the drafter fills them once the plan gave them slots, and verification keeps an accepted
// prefix as committed tokens; n_in_flight is 0 between steps.
struct Sequence {
  SeqId id;
  RequestId request = 0;
  int32_t choice = 0;
  int32_t priority = 0;
  int64_t arrival = 0;  // submission order; kept across preemption (a preempted one goes first)
  int32_t seats = 1;    // running slots it stands for: n until a request's prefill forks
  SeqState state = SeqState::kWaiting;
  std::vector<int32_t> tokens;  // prompt, then output, then drafts in flight
  int32_t n_prompt = 0;
  int32_t n_computed = 0;   // positions whose K/V is in the cache
  int32_t n_in_flight = 0;  // trailing draft tokens, not committed (see above)
  int32_t n_preemptions = 0;
  BlockHash cache_key;
  // Chain hashes of the full blocks of committed tokens (KvCacheManager::HashFullBlocks),
  // extended as tokens commit and never recomputed: committed tokens do not change. A rollback
  // of committed tokens would have to cut this list to the blocks still full. Empty while
  // prefix caching is off.
  std::vector<BlockHash> block_hashes;
  int32_t cached_tokens = -1;  // prefix-cache hit at first admission (-1: not admitted yet)
  // The tiers under RAM (engine/kv_tier.h), indexed by their place in the engine's list: a load
  // of blocks past the RAM prefix is in flight (the scheduler does not admit the sequence until
  // it ends); the tiers that looked for its blocks since it was last queued (a bit each); table
  // hashes each has considered for writing; tokens each loaded.
  bool kv_loading = false;
  uint8_t tiers_probed = 0;
  std::array<int32_t, kMaxTiers> tier_seen{};
  std::array<int32_t, kMaxTiers> tier_tokens{};
  // How it samples (the runner keeps its Sampler, step_batch.h): the request's parameters with
  // the choice's seed, and its logprobs.
  StepSampling sampling;
  SpecState spec;  // speculative decoding's acceptance estimate (spec_policy.h)
  // Token eviction (engine/evictor.h). Once a sequence has evicted, its cached slots no longer
  // hold positions 0, 1, ...: slot i holds the key of position slot_positions[i] (empty while
  // nothing was evicted), and n_evicted positions are gone, so it holds n_slots() slots.
  KvBudget kv_budget;  // unset: no eviction
  // With a budget: the most slots the sequence may hold (its prompt, or its budget and a block;
  // what admission checked the pool can hold). A recompute after preemption is prefilled in
  // chunks that keep under it, evicting after each. 0: no cap.
  int32_t max_slots = 0;
  std::vector<int32_t> slot_positions;
  int32_t n_evicted = 0;
  int32_t decode_steps_since_eviction = 0;
  // [slots] attention each slot received from the observed queries (h2o and snapkv): the model
  // runner adds to it while observe_attention; compaction keeps the kept slots' entries.
  bool observe_attention = false;
  std::vector<float> attention_mass;

  int32_t n_committed() const { return static_cast<int32_t>(tokens.size()) - n_in_flight; }
  int32_t n_output() const { return n_committed() - n_prompt; }
  // Tokens not yet computed, drafts included: the prompt (or everything after a preemption),
  // else the last one (and the drafts after it).
  int32_t n_pending() const { return static_cast<int32_t>(tokens.size()) - n_computed; }
  // More than the last committed token left to compute; drafts after it do not count.
  bool in_prefill() const { return n_committed() - n_computed > 1; }
  int32_t n_slots() const { return n_computed - n_evicted; }
  // n more tokens were computed into the next slots (at their true positions).
  void AdvanceComputed(int32_t n) {
    if (n_evicted > 0) {
      for (int32_t i = 0; i < n; ++i) slot_positions.push_back(n_computed + i);
    }
    n_computed += n;
  }
  // Back to a sequence that never evicted (preemption recomputes it from its tokens).
  void ResetEviction() {
    slot_positions.clear();
    n_evicted = 0;
    decode_steps_since_eviction = 0;
    attention_mass.clear();
  }
};

}  // namespace kvs
