#include "engine/scheduler.h"

#include <algorithm>

#include "core/check.h"

namespace kvs {

bool QueueBefore(const Sequence* a, const Sequence* b) {
  if (a->priority != b->priority) return a->priority > b->priority;
  if (a->arrival != b->arrival) return a->arrival < b->arrival;
  return a->choice < b->choice;
}

namespace {
void InsertOrdered(std::vector<Sequence*>& queue, Sequence* seq) {
  queue.insert(std::upper_bound(queue.begin(), queue.end(), seq, QueueBefore), seq);
}
void Erase(std::vector<Sequence*>& queue, Sequence* seq) {
  auto it = std::find(queue.begin(), queue.end(), seq);
  if (it != queue.end()) queue.erase(it);
}
bool Contains(const std::vector<Sequence*>& v, const Sequence* seq) {
  return std::find(v.begin(), v.end(), seq) != v.end();
}
}  // namespace

int32_t LogitRows(const Sequence& seq, int32_t first, int32_t n_tokens) {
  const int32_t last_committed = seq.n_committed() - 1;
  return std::max(0, first + n_tokens - last_committed);
}

Scheduler::Scheduler(const SchedulerConfig& config, KvCacheManager& kv) : kv_(kv), config_(config) {
  KVS_CHECK(config.max_seqs >= 1 && config.max_batch_tokens >= 1);
}

void Scheduler::AddWaiting(Sequence* seq) {
  kv_.HashFullBlocks(seq->tokens.data(), seq->n_committed(), seq->cache_key, &seq->block_hashes);
  seq->state = SeqState::kWaiting;
  seq->tiers_probed = 0;  // a lower tier may hold its blocks by now
  InsertOrdered(waiting_, seq);
}

void Scheduler::AddRunning(Sequence* seq) {
  seq->state = SeqState::kRunning;
  InsertOrdered(running_, seq);
}

void Scheduler::Remove(Sequence* seq) {
  Erase(running_, seq);
  Erase(waiting_, seq);
  kv_.Free(seq->id);
  seq->state = SeqState::kFinished;
}

int32_t Scheduler::ChunkCap(const Sequence& seq) const {
  if (seq.max_slots <= 0 || seq.n_pending() <= 1) return seq.n_pending();
  // A sequence with a KV budget never holds more than max_slots: its chunks stop there, and
  // token eviction after each brings it back under its budget.
  const int32_t room = seq.max_slots - kv_.Table(seq.id).num_tokens;
  return std::clamp(room, 1, seq.n_pending());
}

bool Scheduler::CutByTime(const Sequence& seq) {
  // A sequence with a KV budget evicts after each prefill chunk: chunks cut by the clock would
  // make what it keeps, and so its output, depend on this machine's speed.
  return seq.in_prefill() && !seq.kv_budget.active();
}

int32_t Scheduler::running_seats() const {
  int32_t seats = 0;
  for (const Sequence* s : running_) seats += s->seats;
  return seats;
}

int32_t Scheduler::AdmissionBlocks(const Sequence& seq, int32_t n_tokens) const {
  const int32_t grow = kv_.BlocksToAppend(seq.id, n_tokens);
  if (config_.reserve_positions <= 0) return grow;
  // Every group's table reserved to the whole context (a sliding window's too: the contiguous
  // baseline of `bench memory` holds what a cache without windows holds).
  return std::max(grow, kv_.BlocksToReserve(seq.id, config_.reserve_positions));
}

SchedulePlan Scheduler::Plan() const {
  SchedulePlan plan;
  PlanState st;
  st.free = kv_.num_free_blocks();
  st.budget = config_.max_batch_tokens;
  st.prefill_budget = st.budget;
  PlanRunning(plan, st);
  CloseDecodes(plan, st);
  // Admissions, in queue order, never past a sequence that does not fit (no overtaking).
  if (plan.preempt.empty()) PlanAdmissions(plan, st);
  for (const ScheduledRun& r : plan.runs) plan.n_tokens += r.n_tokens;
  return plan;
}

void Scheduler::CloseDecodes(const SchedulePlan& plan, PlanState& st) const {
  if (st.decodes_planned) return;
  st.decodes_planned = true;
  const bool decoding = !plan.runs.empty();
  const int32_t used = config_.max_batch_tokens - st.budget;
  if (step_token_cap_ > 0 && decoding) {
    st.prefill_budget = std::max(step_token_cap_ - used, kMinPrefillTokens);
  }
  if (step_overhead_tokens_ > 0 && decoding) {
    st.prefill_budget =
        std::min(st.prefill_budget, std::max(step_overhead_tokens_ + used, kMinPrefillTokens));
  }
  st.prefill_budget = std::min(st.prefill_budget, st.budget);
}

void Scheduler::PlanRunning(SchedulePlan& plan, PlanState& st) const {
  // Running sequences: decodes first, then prefill chunks, each group in queue order.
  std::vector<Sequence*> order;
  for (Sequence* s : running_) {
    if (!s->in_prefill()) order.push_back(s);
  }
  for (Sequence* s : running_) {
    if (s->in_prefill()) order.push_back(s);
  }
  for (Sequence* seq : order) {
    const bool prefill = seq->in_prefill();
    if (prefill) CloseDecodes(plan, st);
    if (st.budget == 0) break;
    if (Contains(plan.preempt, seq)) continue;
    const int32_t n =
        std::min({ChunkCap(*seq), st.budget, CutByTime(*seq) ? st.prefill_budget : st.budget});
    if (n <= 0) continue;
    const int32_t need = kv_.BlocksToAppend(seq->id, n);
    while (need > st.free) {
      // The victim: the last running sequence in queue order not yet planned, else seq itself.
      Sequence* victim = seq;
      for (auto it = running_.rbegin(); it != running_.rend(); ++it) {
        if (*it != seq && !Contains(plan.preempt, *it) &&
            std::find(st.scheduled.begin(), st.scheduled.end(), *it) == st.scheduled.end()) {
          victim = *it;
          break;
        }
      }
      plan.preempt.push_back(victim);
      st.free += kv_.BlocksFreedBy(victim->id);
      if (victim == seq) break;
    }
    if (Contains(plan.preempt, seq)) continue;
    plan.runs.push_back({seq, n, LogitRows(*seq, seq->n_computed, n)});
    st.scheduled.push_back(seq);
    st.free -= need;
    st.budget -= n;
    if (prefill) st.prefill_budget = std::max(0, st.prefill_budget - n);
  }
}

void Scheduler::PlanAdmissions(SchedulePlan& plan, PlanState& st) const {
  int32_t seats = running_seats();
  for (Sequence* seq : waiting_) {
    if (st.budget == 0 || seats + seq->seats > config_.max_seqs) break;
    const int32_t share = CutByTime(*seq) ? st.prefill_budget : st.budget;
    if (share == 0) break;
    // Its prefix is being loaded from a lower tier: later sequences go first meanwhile (as
    // vLLM's requests waiting for remote KV), and it is admitted once the load ended.
    if (seq->kv_loading) continue;
    // The cached prefix is shared, not computed: only the rest is prefilled. Its blocks were
    // hashed when the sequence was queued (AddWaiting).
    PrefixMatch prefix = kv_.Match(seq->block_hashes, seq->n_committed());
    const int32_t n = std::min(std::max(1, ChunkCap(*seq) - prefix.n_tokens), share);
    const int32_t need =
        prefix.blocks.empty() ? AdmissionBlocks(*seq, n) : kv_.BlocksToAdopt(prefix, n);
    if (st.free - need < kv_.watermark_blocks()) break;
    // Apply moves n_computed to the end of the cached prefix: the run starts there.
    const int32_t first = prefix.blocks.empty() ? seq->n_computed : prefix.n_tokens;
    plan.admit.push_back(seq);
    plan.admit_prefix.push_back(std::move(prefix));
    plan.runs.push_back({seq, n, LogitRows(*seq, first, n)});
    st.free -= need;
    st.budget -= n;
    st.prefill_budget = std::max(0, st.prefill_budget - n);
    seats += seq->seats;
  }
}

void Scheduler::Apply(const SchedulePlan& plan, std::vector<BlockCopy>* copies) {
  for (Sequence* seq : plan.preempt) {
    Erase(running_, seq);
    kv_.Free(seq->id);
    seq->n_computed = 0;
    seq->ResetEviction();
    ++seq->n_preemptions;
    AddWaiting(seq);
  }
  // Cached prefixes are taken before anything is allocated, so no allocation of this step can
  // evict a block an admission was planned to share.
  for (size_t i = 0; i < plan.admit.size(); ++i) {
    Sequence* seq = plan.admit[i];
    const PrefixMatch& prefix = plan.admit_prefix[i];
    Erase(waiting_, seq);
    AddRunning(seq);
    if (kv_.prefix_caching()) {
      prefix_queries_ += static_cast<int64_t>(seq->tokens.size());
      prefix_hits_ += prefix.n_tokens;
    }
    if (!prefix.blocks.empty()) {
      kv_.AdoptPrefix(seq->id, prefix);
      seq->n_computed = prefix.n_tokens;
    }
    if (seq->cached_tokens < 0) seq->cached_tokens = prefix.n_tokens;
    if (config_.reserve_positions > 0) KVS_CHECK(kv_.Reserve(seq->id, config_.reserve_positions));
  }
  for (const ScheduledRun& r : plan.runs) {
    KVS_CHECK(kv_.Append(r.seq->id, r.n_tokens, copies));
  }
}

}  // namespace kvs
