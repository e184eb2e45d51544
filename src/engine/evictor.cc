#include "engine/evictor.h"

#include <algorithm>
#include <numeric>

#include "core/check.h"
#include "kv/compaction.h"

namespace kvs {

Evictor::Evictor(const EvictionConfig& config, std::unique_ptr<EvictionPolicy> policy)
    : config_(config), policy_(std::move(policy)) {
  KVS_CHECK(policy_ != nullptr);
}

void Evictor::Attach(Sequence* seq, const KvBudget& request_budget) const {
  seq->kv_budget = request_budget.active() ? request_budget : config_.budget;
  seq->observe_attention = seq->kv_budget.active() && policy_->needs_attention();
}

int32_t Evictor::FirstObservedToken(const Sequence& seq, int32_t first, int32_t n_tokens) {
  const int32_t from = seq.n_committed() - kObservationWindow;
  return std::clamp(from - first, 0, n_tokens);
}

int32_t Evictor::PeakSlots(const KvBudget& budget, int32_t n_prompt, int32_t length,
                           int32_t block_size) const {
  if (!budget.active()) return length;
  // The prompt is whole in the cache until its prefill ends; after that a sequence grows to
  // one block (or --evict-every steps) past its budget before it evicts.
  const int32_t slack = config_.every > 0 ? config_.every : block_size;
  const int64_t decode_peak = int64_t{budget.For(length, config_.guard)} + slack;
  return static_cast<int32_t>(std::min<int64_t>(length, std::max<int64_t>(n_prompt, decode_peak)));
}

Expected<EvictionOutcome> Evictor::AfterStep(Sequence* seq, EvictionPoint point, KvCacheManager& kv,
                                             StepRunner& runner) {
  if (!seq->kv_budget.active()) return EvictionOutcome{};
  // Attention policies score a prompt by its last tokens' attention, which the last chunk
  // brings; only a recompute after preemption (its prompt and output may outgrow the pool)
  // evicts chunk by chunk with them.
  if (point == EvictionPoint::kPrefillChunk && policy_->needs_attention() &&
      seq->n_preemptions == 0) {
    return EvictionOutcome{};
  }
  const int32_t budget = Budget(*seq, kv);
  const int32_t slots = seq->n_slots();
  if (point == EvictionPoint::kDecode) ++seq->decode_steps_since_eviction;
  bool due = false;
  if (point != EvictionPoint::kDecode) {
    due = slots > budget;
  } else if (config_.every > 0) {
    due = slots > budget && seq->decode_steps_since_eviction >= config_.every;
  } else {
    // In 64 bits: a budget near INT32_MAX (--kv-budget 2147483647) plus a block would overflow.
    due = int64_t{slots} >= int64_t{budget} + kv.block_size();
  }
  if (!due) return EvictionOutcome{};
  return Evict(seq, kv, runner);
}

int32_t Evictor::Budget(const Sequence& seq, const KvCacheManager& kv) const {
  // Shared blocks stay as they are and count against the budget: the budget grows to hold
  // them with the sinks and the window rather than fail (or evict every step for nothing).
  const int64_t floor =
      int64_t{kv.SharedPrefixSlots(seq.id)} + config_.guard.sink + config_.guard.window;
  return static_cast<int32_t>(std::min<int64_t>(
      std::max<int64_t>(seq.kv_budget.For(seq.n_computed, config_.guard), floor), INT32_MAX));
}

namespace {
// The RoPE position of each of seq's slots: slot_positions once it has evicted, else 0, 1, ...
// (*identity holds those).
std::span<const int32_t> SlotPositions(const Sequence& seq, std::vector<int32_t>* identity) {
  if (seq.n_evicted > 0) return seq.slot_positions;
  identity->resize(seq.n_slots());
  std::iota(identity->begin(), identity->end(), 0);
  return *identity;
}
}  // namespace

Status Evictor::Score(const Sequence& seq, const BlockTable& table, StepRunner& runner,
                      std::span<float> scores) {
  const int32_t n = seq.n_slots();
  std::vector<int32_t> identity;
  const std::span<const int32_t> positions = SlotPositions(seq, &identity);
  EvictionInput input;
  input.n_slots = n;
  input.n_positions = seq.n_computed;
  input.positions = positions;
  if (policy_->needs_attention()) {
    if (static_cast<int32_t>(seq.attention_mass.size()) != n) {
      return Status::Error(StrFormat("%s: the attention of %zu slots was observed, not %d",
                                     std::string(policy_->name()).c_str(),
                                     seq.attention_mass.size(), n));
    }
    input.attention_mass = seq.attention_mass;
  }
  if (!policy_->needs_keys()) return policy_->Score(input, scores);
  // One score per slot for every layer and head (one block table serves them all): the mean of
  // the per-layer scores.
  const KvKeyShape shape = runner.key_shape();
  if (shape.n_layer <= 0) return Status::Error("this runner cannot read keys back");
  input.n_head_kv = shape.n_head_kv;
  input.head_dim = shape.head_dim;
  keys_.resize(static_cast<size_t>(n) * shape.n_head_kv * shape.head_dim);
  layer_scores_.resize(n);
  std::fill(scores.begin(), scores.end(), 0.0f);
  for (int32_t l = 0; l < shape.n_layer; ++l) {
    KVS_RETURN_IF_ERROR(runner.ReadKeys(table.blocks, n,
                                        seq.n_evicted > 0
                                            ? std::span<const int32_t>(seq.slot_positions)
                                            : std::span<const int32_t>(),
                                        l, keys_));
    input.keys = keys_;
    input.layer = l;
    KVS_RETURN_IF_ERROR(policy_->Score(input, layer_scores_));
    for (int32_t i = 0; i < n; ++i) scores[i] += layer_scores_[i] / shape.n_layer;
  }
  return Status::Ok();
}

Expected<EvictionOutcome> Evictor::Evict(Sequence* seq, KvCacheManager& kv, StepRunner& runner) {
  EvictionOutcome out;
  if (!seq->kv_budget.active() || seq->n_in_flight != 0) return out;
  const BlockTable& table = kv.Table(seq->id);
  const int32_t n = seq->n_slots();
  if (table.num_tokens != n) {
    return Status::Error(StrFormat("eviction: sequence %lld has %d slots in its table, not %d",
                                   (long long)seq->id.value, table.num_tokens, n));
  }
  const int32_t frozen = kv.SharedPrefixSlots(seq->id);
  const int32_t budget = Budget(*seq, kv);
  seq->decode_steps_since_eviction = 0;
  if (budget >= n) return out;
  std::vector<float> scores(n);
  KVS_RETURN_IF_ERROR(Score(*seq, table, runner, scores));
  auto kept = SelectKept(scores, budget, config_.guard, frozen);
  if (!kept.ok()) return kept.status();
  if (static_cast<int32_t>(kept->size()) == n) return out;
  std::vector<int32_t> identity;
  auto plan = PlanCompaction(*kept, SlotPositions(*seq, &identity), kv.block_size(), frozen);
  if (!plan.ok()) return plan.status();
  KVS_RETURN_IF_ERROR(runner.MoveSlots(table.blocks, plan->moves));
  const int32_t first_rewritten = plan->moves.empty() ? plan->n_slots : plan->moves.front().dst;
  KVS_RETURN_IF_ERROR(kv.Compact(seq->id, first_rewritten, plan->n_slots));
  if (!seq->attention_mass.empty()) {
    std::vector<float> mass(plan->n_slots);
    for (int32_t i = 0; i < plan->n_slots; ++i) mass[i] = seq->attention_mass[(*kept)[i]];
    seq->attention_mass = std::move(mass);
  }
  seq->slot_positions = std::move(plan->positions);
  out.evicted = n - plan->n_slots;
  out.blocks_freed = plan->n_freed_blocks;
  out.compacted = true;
  seq->n_evicted += out.evicted;
  return out;
}

}  // namespace kvs
