// StepBatchBuilder: the plan as plain data. Exact block ids of every table change, the slot
// mapping, new and released sequences, drafts and key positions, against the KvCacheManager
// the engine keeps.
#include <gtest/gtest.h>

#include <vector>

#include <cmath>
#include <random>

#include "engine/spec/rejection_sampler.h"
#include "engine/step_batch_builder.h"
#include "engine/step_sampler.h"

namespace kvs {
namespace {

std::vector<int32_t> Ids(const std::vector<BlockId>& blocks) {
  std::vector<int32_t> out;
  for (BlockId b : blocks) out.push_back(b.value);
  return out;
}

Sequence MakeSequence(int64_t id, std::vector<int32_t> tokens) {
  Sequence s;
  s.id = SeqId{id};
  s.tokens = std::move(tokens);
  s.n_prompt = static_cast<int32_t>(s.tokens.size());
  return s;
}

TEST(StepBatchBuilder, SendsTablesWholeOnceThenOnlyTheirChanges) {
  KvCacheManager kv(/*n_blocks=*/16, /*block_size=*/4);
  StepBatchBuilder builder;
  StepBatch batch;
  Sequence a = MakeSequence(1, {10, 11, 12, 13, 14, 15});
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(kv.Append(a.id, 6, &copies));
  const std::vector<int32_t> a_blocks = Ids(kv.Table(a.id).blocks);
  ASSERT_EQ(a_blocks.size(), 2u);
  ScheduledRun run{&a, 6, 1};
  builder.Build({&run, 1}, copies, kv, &batch);
  ASSERT_EQ(batch.new_sequences.size(), 1u);
  EXPECT_EQ(batch.new_sequences[0].seq, 1);
  EXPECT_EQ(batch.new_sequences[0].tokens, a.tokens);
  ASSERT_EQ(batch.runs.size(), 1u);
  const StepRun& r = batch.runs[0];
  EXPECT_EQ(r.tables[0].keep, 0);
  EXPECT_EQ(Ids(r.tables[0].append), a_blocks);
  EXPECT_EQ(r.n_cached, 0);
  EXPECT_EQ(r.first_position, 0);
  EXPECT_EQ(r.n_logits, 1);
  EXPECT_EQ(batch.n_logit_rows, 1);
  EXPECT_EQ(batch.block_size, 4);
  EXPECT_EQ(batch.tokens, a.tokens);
  EXPECT_EQ(batch.positions, (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  for (int32_t p = 0; p < 6; ++p) EXPECT_EQ(batch.slots[0][p], kv.Slot(a.id, p)) << p;
  a.AdvanceComputed(6);

  // A decode inside the second block: nothing of the table changes.
  a.tokens.push_back(16);
  ASSERT_TRUE(kv.Append(a.id, 1, &copies));
  run = {&a, 1, 1};
  builder.Build({&run, 1}, {}, kv, &batch);
  EXPECT_TRUE(batch.new_sequences.empty());
  EXPECT_EQ(batch.runs[0].tables[0].keep, 2);
  EXPECT_TRUE(batch.runs[0].tables[0].append.empty());
  EXPECT_EQ(batch.slots[0], (std::vector<int64_t>{kv.Slot(a.id, 6)}));
  a.AdvanceComputed(1);

  // Two more cross into a third block: only it is sent.
  a.tokens.insert(a.tokens.end(), {17, 18});
  ASSERT_TRUE(kv.Append(a.id, 2, &copies));
  run = {&a, 2, 1};
  builder.Build({&run, 1}, {}, kv, &batch);
  EXPECT_EQ(batch.runs[0].tables[0].keep, 2);
  EXPECT_EQ(Ids(batch.runs[0].tables[0].append),
            (std::vector<int32_t>{kv.Table(a.id).blocks[2].value}));
  a.AdvanceComputed(2);

  // A rollback to 5 positions drops the third block; a regrowth then sends the new one.
  ASSERT_TRUE(kv.Truncate(a.id, 5).ok());
  a.n_computed = 5;
  a.tokens.resize(6);
  ASSERT_TRUE(kv.Append(a.id, 4, &copies));  // positions 5..8: a new third block
  a.tokens.insert(a.tokens.end(), {20, 21, 22});
  run = {&a, 4, 1};
  builder.Build({&run, 1}, {}, kv, &batch);
  EXPECT_EQ(batch.runs[0].tables[0].keep, 2);
  EXPECT_EQ(Ids(batch.runs[0].tables[0].append),
            (std::vector<int32_t>{kv.Table(a.id).blocks[2].value}));
  EXPECT_EQ(batch.runs[0].first_position, 5);
  EXPECT_EQ(batch.tokens, (std::vector<int32_t>{15, 20, 21, 22}));
}

TEST(StepBatchBuilder, ForkedSequencesAreNewAndReleasedOnesAreForgotten) {
  KvCacheManager kv(16, 4);
  StepBatchBuilder builder;
  StepBatch batch;
  std::vector<BlockCopy> copies;
  Sequence parent = MakeSequence(1, {1, 2, 3, 4, 5, 6});
  ASSERT_TRUE(kv.Append(parent.id, 6, &copies));
  ScheduledRun run{&parent, 6, 1};
  builder.Build({&run, 1}, copies, kv, &batch);
  parent.AdvanceComputed(6);
  parent.tokens.push_back(7);

  Sequence child = MakeSequence(2, parent.tokens);
  child.n_computed = 6;
  ASSERT_TRUE(kv.Fork(parent.id, child.id).ok());
  copies.clear();
  ASSERT_TRUE(kv.Append(child.id, 1, &copies));  // its shared partial last block is copied
  ASSERT_EQ(copies.size(), 1u);
  ScheduledRun child_run{&child, 1, 1};
  builder.Build({&child_run, 1}, copies, kv, &batch);
  EXPECT_EQ(batch.copies, copies);
  ASSERT_EQ(batch.new_sequences.size(), 1u);
  EXPECT_EQ(batch.new_sequences[0].seq, 2);
  EXPECT_EQ(batch.new_sequences[0].tokens, child.tokens);
  EXPECT_EQ(batch.runs[0].tables[0].keep, 0);
  EXPECT_EQ(Ids(batch.runs[0].tables[0].append), Ids(kv.Table(child.id).blocks));
  EXPECT_EQ(batch.runs[0].tables[0].append[1], copies[0].dst);
  EXPECT_EQ(batch.runs[0].n_cached, 6);

  // The parent finishes: the next batch says so once; a sequence never sent is not named.
  kv.Free(parent.id);
  builder.Release(parent.id);
  builder.Release(SeqId{99});
  child.AdvanceComputed(1);
  child.tokens.push_back(8);
  ASSERT_TRUE(kv.Append(child.id, 1, &copies));
  builder.Build({&child_run, 1}, {}, kv, &batch);
  EXPECT_EQ(batch.released, (std::vector<int64_t>{1}));
  EXPECT_TRUE(batch.new_sequences.empty());
  builder.Build({&child_run, 1}, {}, kv, &batch);
  EXPECT_TRUE(batch.released.empty());
}

TEST(StepBatchBuilder, CarriesDraftsKeyPositionsAndObservedAttention) {
  KvCacheManager kv(16, 4);
  StepBatchBuilder builder;
  StepBatch batch;
  std::vector<BlockCopy> copies;
  // A sequence that evicted: 3 of its 6 positions are cached, in slots 0..2.
  Sequence s = MakeSequence(1, {1, 2, 3, 4, 5, 6, 7});
  s.n_prompt = 6;
  s.n_computed = 6;
  s.n_evicted = 3;
  s.slot_positions = {0, 4, 5};
  s.observe_attention = true;
  s.attention_mass = {0.5f, 0.25f, 0.25f};
  ASSERT_TRUE(kv.Append(s.id, 4, &copies));  // 3 cached slots and the new token's
  ScheduledRun run{&s, 1, 1};
  builder.Build({&run, 1}, {}, kv, &batch);
  const StepRun& r = batch.runs[0];
  EXPECT_EQ(r.n_cached, 3);
  EXPECT_EQ(r.first_position, 6);
  EXPECT_EQ(r.key_positions, (std::vector<int32_t>{0, 4, 5, 6}));
  EXPECT_EQ(r.attention_mass, s.attention_mass);
  EXPECT_EQ(r.mass_first_token, 0);
  EXPECT_EQ(batch.slots[0], (std::vector<int64_t>{kv.Slot(s.id, 3)}));
  EXPECT_EQ(batch.positions, (std::vector<int32_t>{6}));

  // Two drafts in flight after the last committed token.
  Sequence d = MakeSequence(2, {1, 2, 3, 9, 9});
  d.n_prompt = 3;
  d.n_computed = 2;
  d.n_in_flight = 2;
  ASSERT_TRUE(kv.Append(d.id, 5, &copies));
  ScheduledRun drun{&d, 3, 3};
  builder.Build({&drun, 1}, {}, kv, &batch);
  EXPECT_EQ(batch.runs[0].n_drafts, 2);
  EXPECT_EQ(batch.runs[0].n_logits, 3);
  EXPECT_EQ(batch.runs[0].mass_first_token, -1);
  EXPECT_TRUE(batch.runs[0].key_positions.empty());
}

// ---------------------------------------------------------------------------------------------
// StepSampler: what a runner draws from the batch alone equals what a Sampler of the same
// parameters draws over the same history, step after step (one RNG stream per sequence).

constexpr int32_t kV = 32;

std::vector<float> RandomRows(int32_t rows, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 2.f);
  std::vector<float> out(static_cast<size_t>(rows) * kV);
  for (float& x : out) x = normal(rng);
  return out;
}

SamplingParams Seeded(uint64_t seed) {
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_k = 0;
  p.top_p = 1.f;
  p.min_p = 0.f;
  p.repeat_penalty = 1.3f;
  p.seed = seed;
  return p;
}

// A batch of one run of `seq` over tokens at first_position, sampling n_logits rows.
StepBatch OneRun(int64_t seq, std::vector<int32_t> tokens, int32_t first_position, int32_t n_logits,
                 int32_t n_drafts = 0) {
  StepBatch b;
  StepRun r;
  r.seq = seq;
  r.n_tokens = static_cast<int32_t>(tokens.size());
  r.first_position = first_position;
  r.n_logits = n_logits;
  r.n_drafts = n_drafts;
  b.tokens = std::move(tokens);
  b.runs.push_back(r);
  b.n_logit_rows = n_logits;
  return b;
}

TEST(StepSampler, DrawsAsTheSequencesOwnSamplerStepAfterStep) {
  StepSampler sampler(kV);
  Sampler reference(Seeded(7), kV);
  std::vector<int32_t> history = {3, 4, 5, 4};
  StepBatch b = OneRun(1, history, 0, 1);
  b.new_sequences.push_back({1, history, {Seeded(7), 2}});
  for (uint32_t step = 0; step < 5; ++step) {
    const std::vector<float> logits = RandomRows(1, step);
    ASSERT_TRUE(sampler.Apply(b).ok());
    StepOutput out;
    ASSERT_TRUE(sampler.Sample(b, logits.data(), &out).ok());
    ASSERT_EQ(out.sampled.size(), 1u);
    ASSERT_EQ(out.sampled[0].size(), 1u);
    const SampledTokens& drew = out.sampled[0][0];
    const int32_t want = reference.Sample(logits.data(), history);
    ASSERT_EQ(drew.tokens, (std::vector<int32_t>{want})) << "step " << step;
    // Logprobs: the raw logits' log softmax, and the two best.
    double sum = 0;
    for (int32_t v = 0; v < kV; ++v) sum += std::exp(static_cast<double>(logits[v]));
    ASSERT_EQ(drew.logprobs.size(), 1u);
    EXPECT_NEAR(drew.logprobs[0].logprob, logits[want] - std::log(sum), 1e-4);
    ASSERT_EQ(drew.logprobs[0].top.size(), 2u);
    EXPECT_GE(drew.logprobs[0].top[0].logprob, drew.logprobs[0].top[1].logprob);
    // The next step computes the drawn token, at the next position.
    history.push_back(want);
    b = OneRun(1, {want}, static_cast<int32_t>(history.size()) - 1, 1);
  }
}

TEST(StepSampler, ForksDrawFromTheSameRowWithTheirOwnSeeds) {
  StepSampler sampler(kV);
  const std::vector<int32_t> prompt = {1, 2, 3};
  StepBatch b = OneRun(1, prompt, 0, 1);
  b.new_sequences.push_back({1, prompt, {Seeded(100), -1}});
  b.runs[0].forks = {{2, {Seeded(101), -1}}, {3, {Seeded(102), 1}}};
  const std::vector<float> logits = RandomRows(1, 9);
  ASSERT_TRUE(sampler.Apply(b).ok());
  StepOutput out;
  ASSERT_TRUE(sampler.Sample(b, logits.data(), &out).ok());
  ASSERT_EQ(out.sampled[0].size(), 3u);
  for (int c = 0; c < 3; ++c) {
    Sampler reference(Seeded(100 + c), kV);
    EXPECT_EQ(out.sampled[0][c].tokens[0], reference.Sample(logits.data(), prompt)) << c;
  }
  EXPECT_TRUE(out.sampled[0][0].logprobs.empty());
  EXPECT_EQ(out.sampled[0][2].logprobs.size(), 1u);
  EXPECT_EQ(sampler.num_sequences(), 3u);
  // The forks are sequences of their own from here on; released ones are forgotten.
  StepBatch next = OneRun(3, {out.sampled[0][2].tokens[0]}, 3, 1);
  next.released = {1};
  ASSERT_TRUE(sampler.Apply(next).ok());
  EXPECT_EQ(sampler.num_sequences(), 2u);
}

TEST(StepSampler, VerifiesDraftsAsTheRejectionSamplerDoes) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    StepSampler sampler(kV);
    const std::vector<int32_t> committed = {5, 6, 7};
    StepBatch b = OneRun(1, {7, 9, 11}, 2, 3, /*n_drafts=*/2);
    b.new_sequences.push_back({1, committed, {Seeded(seed), 0}});
    const std::vector<float> logits = RandomRows(3, static_cast<uint32_t>(seed));
    ASSERT_TRUE(sampler.Apply(b).ok());
    StepOutput out;
    ASSERT_TRUE(sampler.Sample(b, logits.data(), &out).ok());
    Sampler reference(Seeded(seed), kV);
    const std::vector<int32_t> drafts = {9, 11};
    const VerifyResult v = VerifyDrafts(reference, logits.data(), kV, committed, drafts, {});
    const SampledTokens& drew = out.sampled[0][0];
    EXPECT_EQ(drew.n_accepted, v.n_accepted);
    std::vector<int32_t> want(drafts.begin(), drafts.begin() + v.n_accepted);
    want.push_back(v.next_token);
    EXPECT_EQ(drew.tokens, want);
    EXPECT_EQ(drew.logprobs.size(), want.size());
  }
}

TEST(StepSampler, RefusesRunsItCannotDrawFor) {
  StepSampler sampler(kV);
  EXPECT_FALSE(sampler.Apply(OneRun(5, {1}, 0, 1)).ok());  // never sent
  StepBatch b = OneRun(1, {1, 2}, 0, 1);
  b.new_sequences.push_back({1, {1, 2}, {Seeded(1), -1}});
  ASSERT_TRUE(sampler.Apply(b).ok());
  EXPECT_FALSE(sampler.Apply(OneRun(1, {3}, 5, 1)).ok());  // a gap: positions 2..4 unknown
  const std::vector<float> logits = RandomRows(2, 1);
  StepOutput out;
  // Two rows but no drafts: nothing says what the second row checks.
  EXPECT_FALSE(sampler.Sample(OneRun(1, {1, 2}, 0, 2), logits.data(), &out).ok());
}

}  // namespace
}  // namespace kvs
