// The scheduler: each step it looks at the running and waiting sequences, the token budget and
// the free blocks, and makes a plan: which sequences run and how many tokens each, which are
// preempted, which are admitted. Planning does not mutate; Apply carries the plan out on the
// KV cache manager (whose allocations then cannot fail).
//
// Policy (vLLM-style continuous batching): running sequences first, decodes before prefill
// chunks; each takes min(pending tokens, budget left), so long prompts are prefilled in chunks.
// When blocks run out, the lowest-priority, latest-arrived running sequence is preempted
// (recompute: its blocks are freed and it rejoins the queue at its old place). New sequences
// are admitted in order (priority, then arrival) only when no one was preempted this step,
// seats (-np) remain, and their first chunk's blocks leave the watermark free.
// Stall-free batching (Sarathi-Serve): with a step token cap set, a step in which sequences
// decode computes at most that many tokens: every decode runs, and prefill chunks and
// admissions share what is left, never less than kMinPrefillTokens so prompts keep moving
// (within max_batch_tokens). Prompts with a KV budget are not cut: they evict after each chunk.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/request.h"
#include "kv/kv_cache_manager.h"

namespace kvs {

// Prefill tokens a step gives waiting prompts however many sequences decode (one block).
inline constexpr int32_t kMinPrefillTokens = 16;

struct SchedulerConfig {
  int32_t max_seqs = 4;            // -np: sequences running at once
  int32_t max_batch_tokens = 512;  // tokens per step, prefill chunks and decodes together
  int32_t reserve_positions = 0;   // > 0: reserve this many positions on admission (contiguous)
};

struct ScheduledRun {
  Sequence* seq = nullptr;
  int32_t n_tokens = 0;  // computes tokens [n_computed, n_computed + n_tokens)
  // Logit rows the run needs, for its last n_logits positions (LogitRows): 1 for a decode or a
  // prompt's last chunk, 0 for an earlier chunk; 1 + k when k drafts are verified.
  int32_t n_logits = 0;
};

// The logit rows a run computing positions [first, first + n_tokens) of seq needs: one for each
// position from the last committed token on (that token's logits sample the next one; a
// draft's check the draft after it).
int32_t LogitRows(const Sequence& seq, int32_t first, int32_t n_tokens);

struct SchedulePlan {
  std::vector<ScheduledRun> runs;  // decodes first, then prefill chunks, then admissions
  std::vector<Sequence*> preempt;
  std::vector<Sequence*> admit;
  std::vector<PrefixMatch> admit_prefix;  // per admitted sequence: its cached prefix
  int32_t n_tokens = 0;
  bool empty() const { return runs.empty() && preempt.empty(); }
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, KvCacheManager& kv);

  const SchedulerConfig& config() const { return config_; }
  // Queues seq (new, or preempted), hashing the full blocks of its committed tokens not hashed
  // yet, so that Plan looks up the prefix cache without hashing.
  void AddWaiting(Sequence* seq);
  // A fork of a running sequence (already holding its blocks) joins the running set directly.
  void AddRunning(Sequence* seq);
  // Drops a finished or cancelled sequence and frees its blocks at once.
  void Remove(Sequence* seq);

  // The most tokens a step in which sequences decode may compute (the engine derives it from
  // --max-step-ms and its step cost model each step); 0: only max_batch_tokens.
  void set_step_token_cap(int32_t n) { step_token_cap_ = n; }
  // And a step's prompt tokens at most overhead + the decode tokens planned: with a step costing
  // a + b·tokens and overhead = a / b, a prompt at most doubles the time of the decode step it
  // joins. With few sequences decoding a prompt then goes in smaller pieces than the target
  // alone would cut, so that the gaps it opens stay near the decodes' own pace; 0: off.
  void set_step_overhead_tokens(int32_t n) { step_overhead_tokens_ = n; }

  SchedulePlan Plan() const;
  // Preempts, admits and allocates; block copies (copy-on-write) are appended to *copies.
  void Apply(const SchedulePlan& plan, std::vector<BlockCopy>* copies);

  int64_t prefix_queries() const { return prefix_queries_; }  // prompt tokens looked up
  int64_t prefix_hits() const { return prefix_hits_; }        // of which found cached
  const std::vector<Sequence*>& running() const { return running_; }
  const std::vector<Sequence*>& waiting() const { return waiting_; }
  int32_t running_seats() const;
  // Tokens of seq a run may compute now: its pending ones, fewer for a sequence whose KV budget
  // caps the slots it holds (Sequence::max_slots).
  int32_t ChunkCap(const Sequence& seq) const;
  // Whether the step token cap may cut seq's run: prefills, except those with a KV budget.
  static bool CutByTime(const Sequence& seq);
  // Blocks a sequence needs to be admitted with its first n tokens.
  int32_t AdmissionBlocks(const Sequence& seq, int32_t n_tokens) const;

 private:
  // What planning a step has left: free blocks, the token budget, prefill's share of it (fixed
  // once the decodes are planned: stall-free batching), and the sequences planned so far.
  struct PlanState {
    int32_t free = 0;
    int32_t budget = 0;
    int32_t prefill_budget = 0;
    bool decodes_planned = false;
    std::vector<const Sequence*> scheduled;
  };
  // Plan's three parts: running sequences (decodes first, then prefill chunks, preempting the
  // last in queue order when blocks run out), prefill's share once the decodes are planned, and
  // admissions in queue order.
  void PlanRunning(SchedulePlan& plan, PlanState& st) const;
  void CloseDecodes(const SchedulePlan& plan, PlanState& st) const;
  void PlanAdmissions(SchedulePlan& plan, PlanState& st) const;
  KvCacheManager& kv_;
  SchedulerConfig config_;
  std::vector<Sequence*> running_;  // in queue order: priority high to low, then arrival
  std::vector<Sequence*> waiting_;  // same order
  int64_t prefix_queries_ = 0, prefix_hits_ = 0;
  int32_t step_token_cap_ = 0;
  int32_t step_overhead_tokens_ = 0;
};

// Queue order: higher priority first, then earlier arrival, then choice.
bool QueueBefore(const Sequence* a, const Sequence* b);

}  // namespace kvs
