#include "engine/step_batch_builder.h"

#include <algorithm>

#include "engine/evictor.h"

namespace kvs {

void StepBatchBuilder::Release(SeqId seq) {
  if (sent_.erase(seq) > 0) released_.push_back(seq.value);
}

void StepBatchBuilder::AddFork(size_t run, SeqId child, const StepSampling& sampling,
                               StepBatch* batch) {
  // Known to the runner from here on, with no table yet: its first run sends the whole one.
  sent_.try_emplace(child);
  batch->runs[run].forks.push_back({child.value, sampling});
}

void StepBatchBuilder::Build(std::span<const ScheduledRun> runs, std::span<const BlockCopy> copies,
                             const KvCacheManager& kv, StepBatch* batch) {
  batch->Clear();
  batch->released.swap(released_);
  batch->copies.assign(copies.begin(), copies.end());
  batch->block_size = kv.block_size();
  for (const ScheduledRun& r : runs) AddRun(r, kv, batch);
}

void StepBatchBuilder::AddRun(const ScheduledRun& r, const KvCacheManager& kv, StepBatch* batch) {
  const Sequence& seq = *r.seq;
  auto [sent, is_new] = sent_.try_emplace(seq.id);
  if (is_new) batch->new_sequences.push_back({seq.id.value, seq.tokens, seq.sampling});
  StepRun run;
  run.seq = seq.id.value;
  run.first_token = batch->n_tokens();
  run.n_tokens = r.n_tokens;
  // After token eviction the cached slots are fewer than the positions computed, and slot i
  // holds the key of position slot_positions[i]; new tokens continue at their true positions.
  run.n_cached = seq.n_slots();
  run.first_position = seq.n_computed;
  run.n_logits = r.n_logits;
  run.n_drafts = seq.n_in_flight;
  // Each group's table change since the runner last saw it: the common prefix stays.
  const int32_t n_groups = kv.num_groups();
  std::vector<std::vector<BlockId>>& mirrors = sent->second;
  mirrors.resize(static_cast<size_t>(n_groups));
  run.tables.resize(static_cast<size_t>(n_groups));
  for (int32_t g = 0; g < n_groups; ++g) {
    const std::vector<BlockId>& table = kv.Table(seq.id, g).blocks;
    std::vector<BlockId>& mirror = mirrors[g];
    const size_t common =
        std::mismatch(mirror.begin(), mirror.end(), table.begin(), table.end()).first -
        mirror.begin();
    run.tables[g].keep = static_cast<int32_t>(common);
    run.tables[g].append.assign(table.begin() + static_cast<ptrdiff_t>(common), table.end());
    mirror = table;
  }
  if (seq.n_evicted > 0) {
    run.key_positions.reserve(static_cast<size_t>(run.n_cached) + r.n_tokens);
    run.key_positions = seq.slot_positions;
    for (int32_t i = 0; i < r.n_tokens; ++i) run.key_positions.push_back(seq.n_computed + i);
  }
  if (seq.observe_attention) {
    run.mass_first_token = Evictor::FirstObservedToken(seq, seq.n_computed, r.n_tokens);
    run.attention_mass = seq.attention_mass;
  }
  const int32_t block_size = kv.block_size();
  batch->slots.resize(static_cast<size_t>(n_groups));
  for (int32_t i = 0; i < r.n_tokens; ++i) {
    const int32_t slot = run.n_cached + i;
    batch->tokens.push_back(seq.tokens[seq.n_computed + i]);
    batch->positions.push_back(seq.n_computed + i);
    for (int32_t g = 0; g < n_groups; ++g) {
      const std::vector<BlockId>& table = mirrors[g];
      batch->slots[g].push_back(static_cast<int64_t>(table[slot / block_size].value) * block_size +
                                slot % block_size);
    }
  }
  batch->n_logit_rows += r.n_logits;
  batch->runs.push_back(std::move(run));
}

}  // namespace kvs
