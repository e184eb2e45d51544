#include "engine/engine.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"

namespace kvs {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "none";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "unknown";
}

Status EngineConfig::Validate() const {
  if (n_ctx < 2) return Status::Error(StrFormat("-c %d: the context must hold at least 2", n_ctx));
  if (max_seqs < 1 || max_seqs > kMaxParallelSequences) {
    return Status::Error(
        StrFormat("-np %d: must be between 1 and %d", max_seqs, kMaxParallelSequences));
  }
  if (max_batch_tokens < 1 || max_batch_tokens > 65536) {
    return Status::Error(
        StrFormat("--max-batch-tokens %d: must be between 1 and 65536", max_batch_tokens));
  }
  if (!(max_step_ms >= 0 && max_step_ms <= 60000)) {
    return Status::Error(
        StrFormat("--max-step-ms %g: must be between 0 (off) and 60000", max_step_ms));
  }
  if (block_size < 1) return Status::Error("--block-size must be positive");
  KVS_RETURN_IF_ERROR(spec.Validate());
  KVS_RETURN_IF_ERROR(eviction.Validate());
  const int64_t blocks_per_seq = (static_cast<int64_t>(n_ctx) + block_size - 1) / block_size;
  const int32_t watermark = watermark_blocks >= 0 ? watermark_blocks : n_blocks / 100;
  if (n_blocks - 1 - watermark < std::min<int64_t>(blocks_per_seq, 1)) {
    return Status::Error(
        StrFormat("the KV memory holds %d blocks: too few for any sequence", n_blocks - 1));
  }
  return Status::Ok();
}

namespace {
std::unique_ptr<EvictionPolicy> PolicyOrDefault(const EvictionConfig& config,
                                                std::unique_ptr<EvictionPolicy> given) {
  if (given) return given;
  auto made = MakeEvictionPolicy(config.policy);
  KVS_CHECK_MSG(made.ok(), made.status().message().c_str());
  return std::move(*made);
}
}  // namespace

Engine::Engine(const EngineConfig& config, StepRunner& runner, Drafter* drafter,
               std::unique_ptr<EvictionPolicy> eviction_policy)
    : config_(config),
      runner_(runner),
      kv_(config.n_blocks, config.block_size,
          config.watermark_blocks >= 0 ? config.watermark_blocks : config.n_blocks / 100,
          runner.kv_groups()),
      scheduler_(SchedulerConfig{config.max_seqs, config.max_batch_tokens,
                                 config.reserve_full_context ? config.n_ctx : 0},
                 kv_),
      drafter_(drafter),
      spec_policy_(config.spec),
      evictor_(config.eviction, PolicyOrDefault(config.eviction, std::move(eviction_policy))),
      connectors_(kv_) {
  KVS_CHECK(config.Validate().ok());
  kv_.set_prefix_caching(config.prefix_caching());
  if (config.kv_event_sink) connectors_.AttachEventSink(config.kv_event_sink);
}

Status Engine::ValidateRequest(const std::vector<int32_t>& prompt, const RequestOptions& o) const {
  if (prompt.empty()) return Status::Error("the prompt is empty (no tokens to start from)");
  for (int32_t t : prompt) {
    if (t < 0 || t >= runner_.n_vocab()) {
      return Status::Error(
          StrFormat("prompt token %d is outside the vocabulary (0..%d)", t, runner_.n_vocab() - 1));
    }
  }
  if (static_cast<int64_t>(prompt.size()) >= config_.n_ctx) {
    return Status::Error(StrFormat("the prompt has %zu tokens; the context (-c) holds %d",
                                   prompt.size(), config_.n_ctx));
  }
  if (o.max_tokens < -1 || o.max_tokens == 0) {
    return Status::Error(
        StrFormat("max_tokens %d: must be positive, or -1 for no limit", o.max_tokens));
  }
  if (o.n < 1 || o.n > config_.max_seqs) {
    return Status::Error(
        StrFormat("n = %d: must be between 1 and the number of parallel "
                  "sequences (-np %d)",
                  o.n, config_.max_seqs));
  }
  if (o.logprobs > 20) return Status::Error(StrFormat("logprobs %d: at most 20", o.logprobs));
  KVS_RETURN_IF_ERROR(o.sampling.Validate());
  const EvictionGuard& guard = config_.eviction.guard;
  // As ParseKvBudget: at most 100% (100.5% too is over), one decimal digit, no negatives.
  const KvBudget& rb = o.kv_budget;
  if (rb.value < 0 || rb.tenths < 0 || rb.tenths > 9 || (!rb.percent && rb.tenths != 0) ||
      (rb.percent && (rb.value > 100 || (rb.value == 100 && rb.tenths > 0))) ||
      (o.kv_budget.active() && !o.kv_budget.percent &&
       o.kv_budget.value < int64_t{guard.sink} + guard.window)) {
    return Status::Error(StrFormat(
        "kv_budget %s: must be a percentage up to 100%% or at least --kv-sink + --kv-window "
        "(%d + %d)",
        o.kv_budget.ToString().c_str(), guard.sink, guard.window));
  }
  if (o.kv_budget.active() && kv_.any_sliding()) {
    return Status::Error(
        "kv_budget: token eviction does not work yet with a model that has sliding-window "
        "layers");
  }
  // Even alone, a sequence must fit the pool, or preemption could never make room for it.
  int64_t positions = config_.n_ctx;
  if (o.max_tokens > 0 && !config_.reserve_full_context) {
    positions = std::min<int64_t>(positions, static_cast<int64_t>(prompt.size()) + o.max_tokens);
  }
  // With a KV budget a sequence holds at most its prompt, or its budget and a block more.
  const KvBudget& budget = o.kv_budget.active() ? o.kv_budget : config_.eviction.budget;
  if (budget.active() && !config_.reserve_full_context) {
    positions = evictor_.PeakSlots(budget, static_cast<int32_t>(prompt.size()),
                                   static_cast<int32_t>(positions), kv_.block_size());
  }
  // A reserved context takes every group's blocks of it (KvCacheManager::Reserve).
  const int64_t need =
      config_.reserve_full_context
          ? int64_t{kv_.BlocksFor(static_cast<int32_t>(positions))} * kv_.num_groups()
          : kv_.PeakBlocks(positions, config_.max_batch_tokens);
  const int32_t room = kv_.num_usable_blocks() - kv_.watermark_blocks();
  if (need > room) {
    return Status::Error(StrFormat(
        "the request needs up to %lld positions of KV (%lld blocks) but the KV memory holds %d "
        "blocks of %d; raise --kv-memory, or lower -c or max_tokens",
        static_cast<long long>(positions), static_cast<long long>(need), room, kv_.block_size()));
  }
  return Status::Ok();
}

Sequence* Engine::NewSequence(RequestId request, int32_t choice, const RequestOptions& options,
                              SeqId id) {
  auto seq = std::make_unique<Sequence>();
  seq->id = id;
  seq->request = request;
  seq->choice = choice;
  seq->priority = options.priority;
  seq->cache_key = options.cache_key;
  evictor_.Attach(seq.get(), options.kv_budget);
  seq->sampling.params = options.sampling;
  seq->sampling.params.seed += static_cast<uint64_t>(choice);
  seq->sampling.logprobs = options.logprobs;
  Sequence* raw = seq.get();
  sequences_.emplace(raw->id, std::move(seq));
  requests_.at(request).live.push_back(raw);
  return raw;
}

Expected<RequestId> Engine::Submit(std::vector<int32_t> prompt, const RequestOptions& options,
                                   TokenCallback on_token) {
  const RequestId id = next_request_;
  KVS_RETURN_IF_ERROR(SubmitWithId(id, std::move(prompt), options, std::move(on_token)));
  ++next_request_;
  return id;
}

Status Engine::SubmitWithId(RequestId id, std::vector<int32_t> prompt,
                            const RequestOptions& options, TokenCallback on_token) {
  KVS_RETURN_IF_ERROR(ValidateRequest(prompt, options));
  if (requests_.contains(id))
    return Status::Error(StrFormat("request id %lld is in use", (long long)id));
  requests_.emplace(id, RequestState{options, std::move(on_token), {}});
  Sequence* seq = NewSequence(id, 0, options, SeqId{next_seq_++});
  seq->arrival = next_arrival_++;
  seq->seats = options.n;
  seq->n_prompt = static_cast<int32_t>(prompt.size());
  seq->tokens = std::move(prompt);
  if (seq->kv_budget.active()) {
    int64_t length = config_.n_ctx;
    if (options.max_tokens > 0) {
      length = std::min<int64_t>(length, int64_t{seq->n_prompt} + options.max_tokens);
    }
    seq->max_slots = evictor_.PeakSlots(seq->kv_budget, seq->n_prompt, static_cast<int32_t>(length),
                                        kv_.block_size());
  }
  scheduler_.AddWaiting(seq);
  return Status::Ok();
}

bool Engine::Cancel(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return false;
  std::vector<Sequence*> live = it->second.live;  // Finish edits the list
  for (Sequence* seq : live) Finish(seq, FinishReason::kCancelled, -1);
  return true;
}

void Engine::CancelAll() {
  while (!requests_.empty()) Cancel(requests_.begin()->first);
}

void Engine::Finish(Sequence* seq, FinishReason reason, int32_t token, const std::string& error) {
  Finish(seq, reason, TokenEvent{seq->request, seq->choice, token, true, reason, error, 0.f, {}});
}

void Engine::Finish(Sequence* seq, FinishReason reason, TokenEvent event) {
  event.finished = true;
  event.reason = reason;
  if (drafter_) drafter_->Release(seq->id);
  batch_builder_.Release(seq->id);
  scheduler_.Remove(seq);
  auto it = requests_.find(seq->request);
  KVS_CHECK(it != requests_.end());
  RequestState& r = it->second;
  r.live.erase(std::find(r.live.begin(), r.live.end(), seq));
  // A request that ends before its prompt forked still owes an end to its other choices.
  std::vector<TokenEvent> events{event};
  for (int32_t c = 1; c < seq->seats; ++c) {
    events.push_back(event);
    events.back().choice = c;
    events.back().token = -1;
  }
  sequences_.erase(seq->id);  // seq is gone from here on
  TokenCallback callback = r.on_token;
  if (r.live.empty()) requests_.erase(it);
  if (callback) {
    for (const TokenEvent& e : events) callback(e);
  }
}

bool Engine::EvictIfDue(Sequence* seq, EvictionPoint point) {
  if (!seq->kv_budget.active()) return true;
  auto outcome = evictor_.AfterStep(seq, point, kv_, runner_);
  if (!outcome.ok()) {
    Finish(seq, FinishReason::kError, -1, "token eviction failed: " + outcome.status().message());
    return false;
  }
  if (outcome->compacted) {
    evicted_tokens_ += outcome->evicted;
    blocks_freed_by_compaction_ += outcome->blocks_freed;
    ++compactions_;
  }
  return true;
}

std::vector<Sequence*> Engine::Fork(Sequence* parent, std::span<const SeqId> child_ids) {
  const RequestOptions& options = requests_.at(parent->request).options;
  KVS_CHECK(static_cast<int32_t>(child_ids.size()) == parent->seats - 1);
  std::vector<Sequence*> children;
  for (int32_t c = 1; c < parent->seats; ++c) {
    Sequence* child = NewSequence(parent->request, c, options, child_ids[c - 1]);
    children.push_back(child);
    child->arrival = parent->arrival;
    child->tokens = parent->tokens;
    child->n_prompt = parent->n_prompt;
    child->n_computed = parent->n_computed;
    child->n_in_flight = parent->n_in_flight;
    child->block_hashes = parent->block_hashes;
    child->max_slots = parent->max_slots;
    child->slot_positions = parent->slot_positions;
    child->n_evicted = parent->n_evicted;
    child->decode_steps_since_eviction = parent->decode_steps_since_eviction;
    child->attention_mass = parent->attention_mass;
    child->cached_tokens = parent->cached_tokens;
    KVS_CHECK(kv_.Fork(parent->id, child->id).ok());
    scheduler_.AddRunning(child);
  }
  parent->seats = 1;
  return children;
}

bool Engine::Emit(Sequence* seq, int32_t token, const SampledLogprobs* logprobs) {
  const RequestOptions& o = requests_.at(seq->request).options;
  TokenEvent event{seq->request, seq->choice, token, false, FinishReason::kNone, {}, 0.f, {}};
  event.cached_tokens = std::max(0, seq->cached_tokens);
  connectors_.FillTierTokens(*seq, event.cached_tokens, &event.tier_tokens);
  if (logprobs != nullptr) {
    event.logprob = logprobs->logprob;
    event.top_logprobs = logprobs->top;
  }
  seq->tokens.push_back(token);
  FinishReason reason = FinishReason::kNone;
  if (std::find(o.stop_ids.begin(), o.stop_ids.end(), token) != o.stop_ids.end()) {
    reason = FinishReason::kStop;
  } else if ((o.max_tokens > 0 && seq->n_output() >= o.max_tokens) ||
             static_cast<int32_t>(seq->tokens.size()) >= config_.n_ctx) {
    reason = FinishReason::kLength;
  }
  if (reason != FinishReason::kNone) {
    Finish(seq, reason, std::move(event));
    return false;
  }
  const RequestState& r = requests_.at(seq->request);
  if (r.on_token) r.on_token(event);
  return true;
}

void Engine::TiersBeforePlan() {
  connectors_.BeforePlan(
      scheduler_.waiting(),
      [this](SeqId id) -> Sequence* {
        auto it = sequences_.find(id);
        return it == sequences_.end() ? nullptr : it->second.get();
      },
      step_cost_.ready() ? step_cost_.per_token() : 0);
}

void Engine::SetStepTarget() {
  if (config_.max_step_ms > 0 && step_cost_.ready()) {
    scheduler_.set_step_token_cap(std::max(1, step_cost_.TokensWithin(config_.max_step_ms / 1e3)));
    // A fit of same-size steps (decodes only) shows no fixed cost: keep the last one seen
    // rather than switch the rule off just before a prompt arrives.
    if (const int32_t overhead = step_cost_.OverheadTokens(); overhead > 0) {
      scheduler_.set_step_overhead_tokens(overhead);
    }
  }
}

void Engine::ProcessRun(size_t i) {
  const ScheduledRun& r = runs_[i];
  Sequence* seq = r.seq;
  const std::vector<SampledTokens>& sampled = output_.sampled[i];
  if (seq->n_in_flight > 0) {
    VerifyAndEmit(seq, sampled[0]);
    return;
  }
  seq->AdvanceComputed(r.n_tokens);
  // Only committed tokens are hashed, so only they can enter the prefix cache; a sequence
  // that evicted holds other tokens in its blocks than its hashes name, so it never commits.
  if (seq->n_evicted == 0) {
    kv_.HashFullBlocks(seq->tokens.data(), seq->n_committed(), seq->cache_key, &seq->block_hashes);
    kv_.CommitFullBlocks(seq->id, seq->block_hashes, seq->n_computed, seq->tokens);
    connectors_.AfterCommit(*seq);
  }
  if (r.n_logits == 0) {
    EvictIfDue(seq, EvictionPoint::kPrefillChunk);
    return;
  }
  // Before the fork: the choices of a request share the compacted prompt.
  const bool prefill = r.n_tokens > 1 || seq->n_output() == 0;
  if (!EvictIfDue(seq, prefill ? EvictionPoint::kPrefillEnd : EvictionPoint::kDecode)) return;
  std::vector<Sequence*> choices{seq};
  if (seq->seats > 1) {
    const std::vector<Sequence*> children = Fork(seq, fork_ids_[i]);
    choices.insert(choices.end(), children.begin(), children.end());
  }
  fork_ids_[i].clear();  // taken: nothing is left for the runner to forget
  for (size_t c = 0; c < choices.size(); ++c) {
    const SampledTokens& drew = sampled[c];
    Emit(choices[c], drew.tokens[0], drew.logprobs.empty() ? nullptr : &drew.logprobs[0]);
  }
}

void Engine::FillStepStats(const SchedulePlan& plan, EngineStepStats* stats) const {
  stats->n_tokens = 0;
  for (const ScheduledRun& r : runs_) stats->n_tokens += r.n_tokens;
  stats->n_preempted = static_cast<int32_t>(plan.preempt.size());
  stats->prefix_queries = scheduler_.prefix_queries();
  stats->prefix_hits = scheduler_.prefix_hits();
  stats->spec_drafts = spec_drafts_;
  stats->spec_draft_tokens = spec_draft_tokens_;
  stats->spec_accepted_tokens = spec_accepted_tokens_;
  stats->evicted_tokens = evicted_tokens_;
  stats->compactions = compactions_;
  stats->blocks_freed_by_compaction = blocks_freed_by_compaction_;
  stats->n_running = static_cast<int32_t>(scheduler_.running().size());
  stats->n_waiting = static_cast<int32_t>(scheduler_.waiting().size());
  for (const Sequence* s : scheduler_.running()) {
    stats->used_positions += kv_.Table(s->id).num_tokens;
  }
  stats->reserved_positions =
      static_cast<int64_t>(kv_.num_usable_blocks() - kv_.num_free_blocks()) * kv_.block_size();
}

void Engine::AddDraftsAndForks() {
  fork_ids_.assign(runs_.size(), {});
  for (size_t i = 0; i < runs_.size(); ++i) {
    Sequence* seq = runs_[i].seq;
    if (i < draft_probs_.size() && !draft_probs_[i].empty()) {
      batch_.runs[i].draft_probs = std::move(draft_probs_[i]);
    }
    // A prompt's last run draws the first token of every choice: the others fork from it.
    if (runs_[i].n_logits == 0 || seq->n_in_flight > 0 || seq->seats <= 1) continue;
    const RequestOptions& options = requests_.at(seq->request).options;
    for (int32_t c = 1; c < seq->seats; ++c) {
      StepSampling sampling{options.sampling, options.logprobs};
      sampling.params.seed += static_cast<uint64_t>(c);
      const SeqId id{next_seq_++};
      fork_ids_[i].push_back(id);
      batch_builder_.AddFork(i, id, sampling, &batch_);
    }
  }
}

Status Engine::CheckDraws() const {
  if (output_.sampled.size() != runs_.size()) {
    return Status::Error(
        StrFormat("the runner drew for %zu runs of %zu", output_.sampled.size(), runs_.size()));
  }
  for (size_t i = 0; i < runs_.size(); ++i) {
    const size_t want = runs_[i].n_logits == 0 ? 0 : 1 + batch_.runs[i].forks.size();
    if (output_.sampled[i].size() != want) {
      return Status::Error(StrFormat("the runner drew %zu choices for a run of %zu",
                                     output_.sampled[i].size(), want));
    }
    const Sequence& seq = *runs_[i].seq;
    for (const SampledTokens& drew : output_.sampled[i]) {
      // One token, or the accepted drafts (as proposed) and the one after them.
      const int32_t k = seq.n_in_flight;
      const bool fits = drew.n_accepted >= 0 && drew.n_accepted <= k &&
                        drew.tokens.size() == static_cast<size_t>(drew.n_accepted) + 1 &&
                        std::equal(drew.tokens.begin(), drew.tokens.begin() + drew.n_accepted,
                                   seq.tokens.begin() + seq.n_committed()) &&
                        (drew.logprobs.empty() || drew.logprobs.size() == drew.tokens.size());
      if (!fits) return Status::Error("the runner's draw does not fit the run it drew for");
      for (int32_t t : drew.tokens) {
        if (t < 0 || t >= runner_.n_vocab()) {
          return Status::Error(StrFormat("the runner drew token %d, outside the vocabulary", t));
        }
      }
    }
  }
  return Status::Ok();
}

Status Engine::Execute() {
  batch_builder_.Build(runs_, copies_, kv_, &batch_);
  AddDraftsAndForks();
  KVS_RETURN_IF_ERROR(runner_.Execute(batch_, &output_));
  KVS_RETURN_IF_ERROR(CheckDraws());
  for (size_t i = 0; i < runs_.size(); ++i) {
    // A runner that does not observe attention (a test's fake) leaves the mass as it was.
    if (batch_.runs[i].mass_first_token >= 0 && i < output_.attention_mass.size() &&
        !output_.attention_mass[i].empty()) {
      runs_[i].seq->attention_mass.swap(output_.attention_mass[i]);
    }
  }
  return Status::Ok();
}

Status Engine::Step(EngineStepStats* stats) {
  // The step's changes of the prefix index (and those of tasks run between steps) go out as one
  // batch when it returns, whichever way it returns.
  struct FlushEvents {
    KvConnectors& connectors;
    ~FlushEvents() { connectors.FlushEvents(); }
  } flush_events{connectors_};
  TiersBeforePlan();
  if (drafter_) AddLookahead();
  const double step_start = clock_();
  SetStepTarget();
  const SchedulePlan plan = scheduler_.Plan();
  if (stats) *stats = EngineStepStats{};
  if (plan.empty()) {
    connectors_.WaitForLoad();
    return Status::Ok();
  }
  copies_.clear();
  scheduler_.Apply(plan, &copies_);
  for (Sequence* seq : plan.preempt) {
    DropDrafts(seq);
    if (drafter_) drafter_->Release(seq->id);
  }
  runs_.assign(plan.runs.begin(), plan.runs.end());
  if (drafter_) ProposeDrafts();

  // A plan of preemptions alone (a sequence that gave its own blocks back) computes nothing:
  // no empty forward pass, which is an error.
  const Status status = runs_.empty() ? Status::Ok() : Execute();
  // Runs are never finished sequences, and sampling only retires the sequence it samples.
  if (status.ok()) {
    for (size_t i = 0; i < runs_.size(); ++i) ProcessRun(i);
  }
  // Forks reserved for runs that never forked (a failed step, an eviction that failed): the
  // runner forgets them.
  for (const std::vector<SeqId>& ids : fork_ids_) {
    for (SeqId id : ids) batch_builder_.Release(id);
  }
  fork_ids_.clear();
  if (!status.ok()) {
    // Each sequence is in a plan once, so every r.seq is still alive here.
    for (const ScheduledRun& r : runs_) Finish(r.seq, FinishReason::kError, -1, status.message());
    return status;
  }
  // Lookahead the plan left out (no budget for it) is dropped: drafts live for one step.
  for (Sequence* seq : scheduler_.running()) DropDrafts(seq);

  if (!runs_.empty()) {
    step_cost_.Observe(plan.n_tokens, clock_() - step_start);
  }
  if (config_.verify_each_step) {
    const Status integrity = kv_.VerifyIntegrity();
    KVS_CHECK_MSG(integrity.ok(), integrity.message().c_str());
  }
  if (stats) FillStepStats(plan, stats);
  return Status::Ok();
}

}  // namespace kvs
