// The engine's speculative decoding: lookahead slots before planning, drafts once the plan gave
// them slots, and after the pass the runner's verification (spec/rejection_sampler.h, run by
// step_sampler.h) committed: the accepted prefix kept, the rest rolled back by trimming the
// block table.
#include <algorithm>

#include "core/check.h"
#include "core/log.h"
#include "engine/engine.h"

namespace kvs {

void Engine::DropDrafts(Sequence* seq) {
  if (seq->n_in_flight == 0) return;
  seq->tokens.resize(seq->n_committed());
  seq->n_in_flight = 0;
}

void Engine::AddLookahead() {
  std::vector<Sequence*> candidates;
  // The positions the step will hold without drafts: one per decode, the prefill chunks (and a
  // waiting prompt's) up to the budget. Past compute_bound_tokens a draft costs full compute.
  int64_t step_tokens = 0;
  int32_t blocks_needed = 0;
  for (Sequence* seq : scheduler_.running()) {
    DropDrafts(seq);
    step_tokens += seq->in_prefill() ? seq->n_pending() : 1;
    blocks_needed += kv_.BlocksToAppend(seq->id, std::min(seq->n_pending(), 1));
    if (seq->in_prefill() || seq->seats > 1 || seq->n_committed() - seq->n_computed != 1) continue;
    if (!requests_.at(seq->request).options.speculative) continue;
    // Drafters read and write slots as positions; a sequence that evicts never drafts.
    if (seq->kv_budget.active()) continue;
    candidates.push_back(seq);
  }
  if (candidates.empty()) return;
  if (!scheduler_.waiting().empty() && scheduler_.running_seats() < config_.max_seqs) {
    step_tokens += scheduler_.waiting().front()->n_pending();
  }
  step_tokens = std::min<int64_t>(step_tokens, config_.max_batch_tokens);
  const int32_t room = spec_policy_.ComputeRoom(static_cast<int32_t>(step_tokens));
  const int32_t cap = room / static_cast<int32_t>(candidates.size());
  // Drafts never cost a running sequence its blocks: their slots come out of what is free
  // beyond the watermark after every running sequence's next token.
  int32_t free = kv_.num_free_blocks() - kv_.watermark_blocks() - blocks_needed;
  for (Sequence* seq : candidates) {
    const RequestOptions& o = requests_.at(seq->request).options;
    // Never draft past what the request may still emit: accepted drafts plus the token after
    // them must fit max_tokens and the context.
    int32_t remaining = config_.n_ctx - seq->n_committed();
    if (o.max_tokens > 0) remaining = std::min(remaining, o.max_tokens - seq->n_output());
    const int32_t context = seq->n_committed();
    int32_t k = std::min(spec_policy_.Choose(seq->spec, cap, drafter_->relative_cost_at(context),
                                             runner_.KvShareAt(context)),
                         remaining - 1);
    for (; k > 0; --k) {
      const int32_t extra = kv_.BlocksToAppend(seq->id, 1 + k) - kv_.BlocksToAppend(seq->id, 1);
      if (extra <= free) {
        free -= extra;
        break;
      }
    }
    if (k <= 0) {
      ++seq->spec.idle_steps;
      continue;
    }
    seq->spec.idle_steps = 0;
    // Placeholders (the last token, a valid id) until the drafter fills them.
    seq->tokens.insert(seq->tokens.end(), k, seq->tokens.back());
    seq->n_in_flight = k;
  }
}

void Engine::ProposeDrafts() {
  std::vector<DraftRequest> requests;
  std::vector<size_t> run_of;
  for (size_t i = 0; i < runs_.size(); ++i) {
    Sequence* seq = runs_[i].seq;
    if (seq->n_in_flight == 0) continue;
    // A decode run starts at the last committed token: its other positions are the drafts the
    // budget left room for.
    const int32_t k = runs_[i].n_tokens - 1;
    seq->tokens.resize(seq->n_committed() + k);
    seq->n_in_flight = k;
    if (k > 0) {
      requests.push_back({seq, k});
      run_of.push_back(i);
    }
  }
  draft_probs_.assign(runs_.size(), {});
  if (requests.empty()) return;
  // The drafter reads and writes the blocks this step: the copy-on-write copies come first.
  Status status = runner_.CopyBlocks(copies_);
  copies_.clear();
  std::vector<Draft> drafts(requests.size());
  if (status.ok()) status = drafter_->Propose(requests, kv_, drafts);
  if (!status.ok()) {
    KVS_LOG_WARN("speculative decoding: the %.*s drafter failed, this step verifies no drafts: %s",
                 static_cast<int>(drafter_->name().size()), drafter_->name().data(),
                 status.message().c_str());
    for (Draft& d : drafts) d.tokens.clear();
  }
  for (size_t j = 0; j < requests.size(); ++j) {
    ScheduledRun& run = runs_[run_of[j]];
    Sequence* seq = run.seq;
    const int32_t k = requests[j].max_drafts;
    const int32_t base = seq->n_committed();
    Draft& d = drafts[j];
    int32_t m = 0;
    while (m < k && m < static_cast<int32_t>(d.tokens.size()) && d.tokens[m] >= 0 &&
           d.tokens[m] < runner_.n_vocab()) {
      seq->tokens[base + m] = d.tokens[m];
      ++m;
    }
    // The positions of drafts not proposed are not computed: the run shrinks to the others,
    // and so does the block table, which the plan grew by the whole run. Without drafts no
    // verification rolls it back: the positions would stay allocated for good, until the
    // sequence's table outgrew the pool and it preempted itself.
    seq->tokens.resize(base + m);
    seq->n_in_flight = m;
    run.n_tokens -= k - m;
    run.n_logits -= k - m;
    if (m < k) KVS_CHECK(kv_.Truncate(seq->id, seq->n_computed + run.n_tokens).ok());
    if (m == 0) continue;
    if (!d.probs.empty()) {
      d.probs.resize(m);
      draft_probs_[run_of[j]] = std::move(d.probs);
    }
    ++spec_drafts_;
    spec_draft_tokens_ += m;
  }
}

void Engine::VerifyAndEmit(Sequence* seq, const SampledTokens& verified) {
  const int32_t base = seq->n_committed();
  const int32_t k = seq->n_in_flight;
  const int32_t n_accepted = verified.n_accepted;
  spec_accepted_tokens_ += n_accepted;
  SpecPolicy::Record(&seq->spec, k, n_accepted);
  // Keep the K/V of the last committed token and the accepted drafts; the rejected positions'
  // blocks go back to the pool before anything hashes them.
  seq->n_in_flight = 0;
  seq->tokens.resize(base + n_accepted);
  seq->n_computed = base + n_accepted;
  KVS_CHECK(kv_.Truncate(seq->id, seq->n_computed).ok());
  kv_.HashFullBlocks(seq->tokens.data(), seq->n_committed(), seq->cache_key, &seq->block_hashes);
  kv_.CommitFullBlocks(seq->id, seq->block_hashes, seq->n_computed, seq->tokens);
  connectors_.AfterCommit(*seq);
  // Emit appends the accepted drafts again one at a time, each with its own logprobs, and
  // stops at the first that ends the request (stop token, max_tokens, context).
  seq->tokens.resize(base);
  for (size_t i = 0; i < verified.tokens.size(); ++i) {
    const SampledLogprobs* lp = verified.logprobs.empty() ? nullptr : &verified.logprobs[i];
    if (!Emit(seq, verified.tokens[i], lp)) return;
  }
}

}  // namespace kvs
