// The engine: requests in, tokens out, one step at a time. Each step the scheduler plans, the
// plan goes to the runner as plain data (step_batch.h), the runner computes it and draws the
// tokens, and the engine commits and streams them, forks n > 1 requests after their prefill, and
// retires finished sequences (freeing their blocks).
// Single-threaded: AsyncEngine puts a thread and a thread-safe inbox in front of it.
// Token callbacks run inside Step() and must not call back into the Engine.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "engine/evictor.h"
#include "engine/kv_connectors.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "engine/spec/drafter.h"
#include "engine/spec/spec_policy.h"
#include "engine/step_batch_builder.h"
#include "engine/step_cost_model.h"
#include "engine/step_runner.h"
#include "kv/kv_cache_manager.h"

namespace kvs {

// The most sequences one engine runs at once (-np). llama.cpp caps them at 256 (LLAMA_MAX_SEQ)
// and vLLM's max_num_seqs defaults to 256 (1024 on large GPUs); on a CPU a step past a few
// hundred sequences is all decode, each getting a sliver of it. The real cost of a slot is the
// KV cache sized by default for -np full contexts: a larger -np only asks for more memory.
inline constexpr int32_t kMaxParallelSequences = 1024;

struct EngineConfig {
  int32_t n_ctx = 4096;            // -c: most positions (prompt + output) one sequence may hold
  int32_t max_seqs = 4;            // -np/--parallel
  int32_t max_batch_tokens = 512;  // --max-batch-tokens
  double max_step_ms = 100;        // --max-step-ms: stall-free batching's step target (0: off); the
                                   // same default as kvserve::EngineOptions
  int32_t block_size = 16;         // --block-size
  int32_t n_blocks = 0;            // pool size, null block included (from --kv-memory)
  int32_t watermark_blocks = -1;   // -1: 1% of the pool
  bool reserve_full_context = false;     // the contiguous baseline: admission reserves n_ctx
  bool verify_each_step = false;         // KvCacheManager::VerifyIntegrity after every step
  bool prefix_cache = true;              // share cached full blocks of repeated prefixes
  SpecConfig spec;                       // speculative decoding, when the engine has a drafter
  EvictionConfig eviction;               // token eviction (--kv-budget ...; requests' kv_budget)
  KvTierConfig kv_disk;                  // the disk tier (--kv-disk DIR ...; no dir: none)
  KvRedisConfig kv_redis;                // the Redis tier (--kv-redis URL ...; no URL: none)
  KvEventSink* kv_event_sink = nullptr;  // KV events (--kv-events); not owned, outlives the engine

  Status Validate() const;
  // Whether full blocks are shared (the contiguous baseline never shares): what the tiers and
  // KV events need.
  bool prefix_caching() const { return prefix_cache && !reserve_full_context; }
};

struct EngineStepStats {
  int32_t n_tokens = 0;  // computed this step
  int32_t n_running = 0;
  int32_t n_waiting = 0;
  int32_t n_preempted = 0;
  int64_t used_positions = 0;      // positions holding K/V, over running sequences
  int64_t reserved_positions = 0;  // positions of the blocks in use
  int64_t prefix_queries = 0;      // totals so far: prompt tokens looked up in the prefix cache
  int64_t prefix_hits = 0;         // and found there
  // Speculative decoding, totals so far (vLLM's spec_decode counters): verifications with at
  // least one draft, drafted tokens, and of those the accepted ones.
  int64_t spec_drafts = 0;
  int64_t spec_draft_tokens = 0;
  int64_t spec_accepted_tokens = 0;
  // Token eviction, totals so far: positions dropped, evictions that dropped any, and the whole
  // blocks they returned to the pool.
  int64_t evicted_tokens = 0;
  int64_t compactions = 0;
  int64_t blocks_freed_by_compaction = 0;
};

class Engine {
 public:
  // drafter: null, or what proposes drafts for speculative decoding (it must outlive the
  // engine); every decoding sequence may then verify up to config.spec.draft_max drafts a step.
  // eviction_policy: the token eviction policy (null: made from config.eviction.policy; the
  // tri policy needs a calibration, so its builder passes it in).
  Engine(const EngineConfig& config, StepRunner& runner, Drafter* drafter = nullptr,
         std::unique_ptr<EvictionPolicy> eviction_policy = nullptr);

  // Queues a request; its tokens stream through on_token. Bad input is an error, never a crash.
  Expected<RequestId> Submit(std::vector<int32_t> prompt, const RequestOptions& options,
                             TokenCallback on_token);
  // The same with an id chosen by the caller (AsyncEngine hands ids out before queueing);
  // ids must be unique and never mixed with Submit's.
  Status SubmitWithId(RequestId id, std::vector<int32_t> prompt, const RequestOptions& options,
                      TokenCallback on_token);
  Status ValidateRequest(const std::vector<int32_t>& prompt, const RequestOptions& options) const;
  // Ends a request now: its blocks are freed before this returns; each live choice gets a
  // kCancelled event. False when the request is unknown or already finished.
  bool Cancel(RequestId id);
  void CancelAll();

  // One step. A runner failure fails the step's requests (kError events) and is returned.
  Status Step(EngineStepStats* stats = nullptr);
  bool HasWork() const { return !requests_.empty(); }

  const EngineConfig& config() const { return config_; }
  const KvCacheManager& kv() const { return kv_; }
  const Scheduler& scheduler() const { return scheduler_; }
  const Drafter* drafter() const { return drafter_; }
  const Evictor& evictor() const { return evictor_; }
  // What times steps for --max-step-ms (seconds, monotonic); tests give their own clock.
  void set_clock(std::function<double()> now_seconds) { clock_ = std::move(now_seconds); }
  const StepCostModel& step_cost() const { return step_cost_; }

  // The tiers under the prefix cache and its KV events (kv_connectors.h).
  KvConnectors& connectors() { return connectors_; }
  const KvConnectors& connectors() const { return connectors_; }

 private:
  struct RequestState {
    RequestOptions options;
    TokenCallback on_token;
    std::vector<Sequence*> live;
  };

  // Makes the parent's other choices, with the ids reserved for them when the step was built.
  std::vector<Sequence*> Fork(Sequence* parent, std::span<const SeqId> child_ids);
  // Appends token (the runner's draw, with its logprobs when asked) to seq and streams it;
  // retires seq when it is done. False when seq is gone.
  bool Emit(Sequence* seq, int32_t token, const SampledLogprobs* logprobs);
  // Speculation (engine_spec.cc): lookahead placeholders before planning, the drafter's tokens
  // once the plan gave them slots, and after the pass the runner's verification committed.
  void AddLookahead();
  void ProposeDrafts();
  void VerifyAndEmit(Sequence* seq, const SampledTokens& verified);
  void DropDrafts(Sequence* seq);
  // Token eviction after a run computed seq's tokens (evictor.h); false when it failed and
  // finished seq.
  bool EvictIfDue(Sequence* seq, EvictionPoint point);
  void Finish(Sequence* seq, FinishReason reason, int32_t token, const std::string& error = {});
  // Step's parts, in its order: the tiers' lookups and loads, the stall-free step target, one
  // run's results, the step's stats.
  void TiersBeforePlan();
  void SetStepTarget();
  void ProcessRun(size_t run);
  // The runner's part of a step: the plan as plain data, executed; the observed attention back.
  Status Execute();
  // Whether the runner's draws fit the runs (one per choice; a verification's accepted drafts
  // as proposed; tokens in the vocabulary): a runner's fault is an error, never a bad stream.
  Status CheckDraws() const;
  void FillStepStats(const SchedulePlan& plan, EngineStepStats* stats) const;
  void Finish(Sequence* seq, FinishReason reason, TokenEvent event);
  Sequence* NewSequence(RequestId request, int32_t choice, const RequestOptions& options, SeqId id);
  // What the runner draws for the step beside the builder's data: the drafts' distributions,
  // and the choices a prompt's last run forks into (their ids reserved now).
  void AddDraftsAndForks();

  EngineConfig config_;
  StepRunner& runner_;
  KvCacheManager kv_;
  Scheduler scheduler_;
  StepCostModel step_cost_;  // step wall time against tokens, for --max-step-ms
  std::function<double()> clock_ = [] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  std::map<RequestId, RequestState> requests_;
  std::map<SeqId, std::unique_ptr<Sequence>> sequences_;
  RequestId next_request_ = 1;
  int64_t next_seq_ = 1;
  int64_t next_arrival_ = 0;
  std::vector<BlockCopy> copies_;
  StepBatchBuilder batch_builder_;  // the runner's view of the sequences, step by step
  StepBatch batch_;
  StepOutput output_;
  std::vector<ScheduledRun> runs_;  // the step's runs, as drafting trimmed them
  Drafter* drafter_ = nullptr;
  SpecPolicy spec_policy_;
  std::vector<std::vector<std::vector<TokenProb>>> draft_probs_;  // per run: per draft, its q
  std::vector<std::vector<SeqId>> fork_ids_;  // per run: the ids its forks were given
  int64_t spec_drafts_ = 0, spec_draft_tokens_ = 0, spec_accepted_tokens_ = 0;
  Evictor evictor_;
  KvConnectors connectors_;  // after kv_: it listens to kv_'s prefix index
  int64_t evicted_tokens_ = 0, compactions_ = 0, blocks_freed_by_compaction_ = 0;
};

}  // namespace kvs
