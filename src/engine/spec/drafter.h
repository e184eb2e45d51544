// The drafter seam of speculative decoding: something that proposes the next few tokens of a
// sequence cheaply, for the target model to check all at once. Three implementations: a draft
// model with its own KV (draft_model_drafter.h), prompt lookup (ngram_drafter.h), and the
// target over a compressed view of its own weights and a window of its own KV (self_drafter.h).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "engine/request.h"
#include "engine/sampler.h"
#include "kv/kv_cache_manager.h"

namespace kvs {

// One sequence's request for drafts this step.
struct DraftRequest {
  // The sequence to extend: its committed tokens are seq->tokens[0, seq->n_committed()), the
  // last of which is not computed yet (seq->n_computed == n_committed - 1). Drafts follow it.
  const Sequence* seq = nullptr;
  // Most drafts wanted: the lookahead slots the step gave the sequence. Its block table holds
  // positions [0, n_committed + max_drafts).
  int32_t max_drafts = 0;
};

struct Draft {
  std::vector<int32_t> tokens;  // at most max_drafts
  // Per token, the processed distribution q it was drawn from, drawn with the sequence's own
  // sampling parameters (Sampler::SampleWithDistribution) so that p and q are comparable; empty
  // for a drafter that has no distribution (every draft is then a point mass).
  std::vector<std::vector<TokenProb>> probs;
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  virtual std::string_view name() const = 0;  // "draft", "ngram", "self"
  // What one drafted token costs, as a fraction of a target decode step (bytes read per token),
  // for the adaptive choice of k (spec_policy.h).
  virtual double relative_cost() const = 0;
  // The same for a sequence of n_context positions, where the draft's own KV reads count: a
  // draft that attends to the whole context costs more as it grows, a windowed one does not,
  // while the target's step grows with its KV either way.
  virtual double relative_cost_at(int32_t n_context) const { return relative_cost(); }
  // Fills drafts[i] for requests[i]. Runs after the step's plan was applied and its block copies
  // done, before the verification pass: a drafter may write K/V into a request's own slots at
  // positions >= seq->n_computed (the verification rewrites them), and nowhere else. A failure
  // only costs the step its drafts (the engine verifies nothing and logs it).
  virtual Status Propose(std::span<const DraftRequest> requests, const KvCacheManager& kv,
                         std::span<Draft> drafts) = 0;
  // The sequence finished, was cancelled or preempted: drop what is kept for it.
  virtual void Release(SeqId seq) {}
};

}  // namespace kvs
