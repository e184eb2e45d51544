// StepBatchBuilder: the plan as plain data. Exact block ids of every table change, the slot
// mapping, new and released sequences, drafts and key positions, against the KvCacheManager
// the engine keeps.
#include <gtest/gtest.h>

#include <vector>

#include "engine/step_batch_builder.h"

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
  EXPECT_EQ(r.table_keep, 0);
  EXPECT_EQ(Ids(r.table_append), a_blocks);
  EXPECT_EQ(r.n_cached, 0);
  EXPECT_EQ(r.first_position, 0);
  EXPECT_EQ(r.n_logits, 1);
  EXPECT_EQ(batch.n_logit_rows, 1);
  EXPECT_EQ(batch.block_size, 4);
  EXPECT_EQ(batch.tokens, a.tokens);
  EXPECT_EQ(batch.positions, (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  for (int32_t p = 0; p < 6; ++p) EXPECT_EQ(batch.slots[p], kv.Slot(a.id, p)) << p;
  a.AdvanceComputed(6);

  // A decode inside the second block: nothing of the table changes.
  a.tokens.push_back(16);
  ASSERT_TRUE(kv.Append(a.id, 1, &copies));
  run = {&a, 1, 1};
  builder.Build({&run, 1}, {}, kv, &batch);
  EXPECT_TRUE(batch.new_sequences.empty());
  EXPECT_EQ(batch.runs[0].table_keep, 2);
  EXPECT_TRUE(batch.runs[0].table_append.empty());
  EXPECT_EQ(batch.slots, (std::vector<int64_t>{kv.Slot(a.id, 6)}));
  a.AdvanceComputed(1);

  // Two more cross into a third block: only it is sent.
  a.tokens.insert(a.tokens.end(), {17, 18});
  ASSERT_TRUE(kv.Append(a.id, 2, &copies));
  run = {&a, 2, 1};
  builder.Build({&run, 1}, {}, kv, &batch);
  EXPECT_EQ(batch.runs[0].table_keep, 2);
  EXPECT_EQ(Ids(batch.runs[0].table_append),
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
  EXPECT_EQ(batch.runs[0].table_keep, 2);
  EXPECT_EQ(Ids(batch.runs[0].table_append),
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
  EXPECT_EQ(batch.runs[0].table_keep, 0);
  EXPECT_EQ(Ids(batch.runs[0].table_append), Ids(kv.Table(child.id).blocks));
  EXPECT_EQ(batch.runs[0].table_append[1], copies[0].dst);
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
  EXPECT_EQ(batch.slots, (std::vector<int64_t>{kv.Slot(s.id, 3)}));
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

}  // namespace
}  // namespace kvs
