// Token eviction in the engine (issue #19), end to end. With a fake runner that records which
// position each physical KV slot holds: compaction moves exactly the kept slots, the table keeps
// exactly the expected blocks and returns the others, forks and prefix-cache hits share blocks
// that are never rewritten, preemption recomputes and evicts again. And bad budgets and settings
// are refused with messages naming them. The real-model cases are in eviction_model_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cmath>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_builder.h"
#include "testing/fake_model.h"
#include "testing/int_lists.h"
#include "testing/test_models.h"

namespace kvs {
namespace {

using namespace testing;  // NOLINT(google-build-using-namespace)

// ------------------------------------------------------------------------------------------
// A fake runner whose KV memory is one int per physical slot: the position computed into it.
// Execute writes each computed token's position into its slot, CopyBlocks and MoveSlots move
// those ints as the real runner moves bytes, and ReadKeys returns keys made from the positions
// the slots hold, so that a key-reading policy keeps an irregular set.
class SlotRecordingRunner final : public StepRunner {
 public:
  SlotRecordingRunner(int32_t n_blocks, int32_t block_size)
      : block_size_(block_size), slots_(static_cast<size_t>(n_blocks) * block_size, -1) {}

  int32_t n_vocab() const override { return kVocab; }
  Status CopyBlocks(std::span<const BlockCopy> copies) override {
    for (const BlockCopy& c : copies) {
      for (int32_t i = 0; i < block_size_; ++i) {
        slots_[static_cast<size_t>(c.dst.value) * block_size_ + i] =
            slots_[static_cast<size_t>(c.src.value) * block_size_ + i];
      }
    }
    return Status::Ok();
  }
  Status Execute(const StepBatch& step, StepOutput* out) override {
    KVS_RETURN_IF_ERROR(CopyBlocks(step.copies));
    mirror_.Apply(step);
    KVS_RETURN_IF_ERROR(sampler_.Apply(step));
    logits_.assign(static_cast<size_t>(step.n_logit_rows) * kVocab, 0.f);
    int32_t row = 0;
    for (const StepRun& r : step.runs) {
      EXPECT_GE(static_cast<int64_t>(mirror_.table(r.seq).size()) * block_size_,
                r.n_cached + r.n_tokens);
      for (int32_t i = 0; i < r.n_tokens; ++i) {
        // The slot mapping names the slot n_cached + i of the run's table.
        const int64_t slot = step.slots[0][r.first_token + i];
        EXPECT_EQ(static_cast<size_t>(slot), Physical(mirror_.table(r.seq), r.n_cached + i));
        slots_[slot] = step.positions[r.first_token + i];
      }
      for (int32_t i = 0; i < r.n_logits; ++i) {
        float* row_logits = logits_.data() + static_cast<size_t>(row++) * kVocab;
        const size_t n = static_cast<size_t>(r.first_position + r.n_tokens - r.n_logits + i + 1);
        row_logits[NextToken(mirror_.tokens(r.seq), n)] = 10.f;
      }
    }
    return sampler_.Sample(step, logits_.data(), out);
  }
  KvKeyShape key_shape() const override { return {2, 1, 4}; }
  Status ReadKeys(std::span<const BlockId> table, int32_t n, std::span<const int32_t>,
                  int32_t layer, std::span<float> keys) override {
    EXPECT_EQ(keys.size(), static_cast<size_t>(n) * 4);
    for (int32_t i = 0; i < n; ++i) {
      const int32_t pos = slots_[Physical(table, i)];
      const uint32_t h = static_cast<uint32_t>(pos) * 2654435761u + layer;
      for (int32_t d = 0; d < 4; ++d) keys[i * 4 + d] = std::sin(static_cast<float>(h % 97 + d));
    }
    return Status::Ok();
  }
  Status MoveSlots(std::span<const BlockId> table, std::span<const SlotMove> moves) override {
    for (const SlotMove& m : moves) {
      EXPECT_LT(m.dst, m.src);
      slots_[Physical(table, m.dst)] = slots_[Physical(table, m.src)];
      ++n_moves;
    }
    return Status::Ok();
  }

  size_t Physical(std::span<const BlockId> table, int32_t slot) const {
    return static_cast<size_t>(table[slot / block_size_].value) * block_size_ + slot % block_size_;
  }
  size_t Physical(const BlockTable& table, int32_t slot) const {
    return Physical(std::span<const BlockId>(table.blocks), slot);
  }
  // The positions the sequence's first n slots hold, read through its table.
  std::vector<int32_t> Read(const BlockTable& table, int32_t n) const {
    std::vector<int32_t> out;
    for (int32_t i = 0; i < n; ++i) out.push_back(slots_[Physical(table, i)]);
    return out;
  }

  int64_t n_moves = 0;

 private:
  RunnerMirror mirror_;
  StepSampler sampler_{kVocab};
  std::vector<float> logits_;
  int32_t block_size_;
  std::vector<int32_t> slots_;
};

// The positions a sequence's slots must hold: slot_positions once it evicted, else 0, 1, ...
std::vector<int32_t> ExpectedSlots(const Sequence& s) {
  if (s.n_evicted > 0) return s.slot_positions;
  std::vector<int32_t> p(s.n_slots());
  std::iota(p.begin(), p.end(), 0);
  return p;
}

// After a step: every running sequence's table holds exactly its slots, and reading them through
// the table gives the positions the sequence believes they hold.
void ExpectSlotsHoldTheirPositions(const Engine& e, const SlotRecordingRunner& runner) {
  for (const Sequence* s : e.scheduler().running()) {
    const BlockTable& t = e.kv().Table(s->id);
    ASSERT_EQ(t.num_tokens, s->n_slots()) << "sequence " << s->id.value;
    EXPECT_EQ(runner.Read(t, s->n_slots()), ExpectedSlots(*s)) << "sequence " << s->id.value;
    if (s->n_evicted > 0) {
      ASSERT_EQ(static_cast<int32_t>(s->slot_positions.size()), s->n_slots());
      EXPECT_TRUE(std::is_sorted(s->slot_positions.begin(), s->slot_positions.end()));
      EXPECT_EQ(s->slot_positions.back(), s->n_computed - 1);
    }
  }
}

std::vector<BlockId> Blocks(std::initializer_list<int32_t> ids) {
  std::vector<BlockId> out;
  for (int32_t id : ids) out.push_back(BlockId{id});
  return out;
}

EngineConfig FakeConfig(int32_t n_blocks, const std::string& policy, int32_t sink, int32_t window) {
  EngineConfig c;
  c.n_ctx = 256;
  c.n_blocks = n_blocks;
  c.block_size = 4;
  c.max_seqs = 4;
  c.max_batch_tokens = 64;
  c.watermark_blocks = 0;
  c.verify_each_step = true;
  c.eviction.policy = policy;
  c.eviction.guard = {sink, window};
  return c;
}

RequestOptions WithBudget(RequestOptions o, int32_t value, bool percent = false) {
  o.kv_budget = KvBudget{value, percent};
  return o;
}

Sequence* Running(const Engine& e, size_t i = 0) {
  return i < e.scheduler().running().size() ? e.scheduler().running()[i] : nullptr;
}

// Streaming, budget 8 of blocks of 4, sinks 2, window 4: the exact kept positions, moved
// contents and block ids, step by step.
TEST(EvictionEngineFake, StreamingCompactionIsExactToTheSlotAndBlock) {
  SlotRecordingRunner runner(16, 4);
  Engine e(FakeConfig(16, "streaming", 2, 4), runner);
  ASSERT_EQ(e.kv().num_free_blocks(), 15);
  Collected c;
  Submit(e, Prompt(10, 3), WithBudget(Greedy(12), 8), &c);

  // Step 1: the prompt (positions 0..9 in blocks 1, 2, 3), then evicted down to 8 at the end of
  // prefill: the sinks 0, 1 and the six most recent; block 3 comes free.
  EngineStepStats st;
  ASSERT_TRUE(e.Step(&st).ok());
  Sequence* s = Running(e);
  ASSERT_NE(s, nullptr);
  EXPECT_EQ(s->slot_positions, Concat({0, 1}, Range(4, 10)));
  EXPECT_EQ(s->n_evicted, 2);
  EXPECT_EQ(e.kv().Table(s->id).blocks, Blocks({1, 2}));
  EXPECT_TRUE(e.kv().Table(s->id).compacted);
  EXPECT_TRUE(e.kv().Table(s->id).hashes.empty()) << "block 1 was rewritten: no hash may stay";
  EXPECT_EQ(e.kv().num_free_blocks(), 13);
  EXPECT_EQ(st.evicted_tokens, 2);
  EXPECT_EQ(st.blocks_freed_by_compaction, 1);
  EXPECT_EQ(st.compactions, 1);
  ExpectSlotsHoldTheirPositions(e, runner);

  // Steps 2..5 decode positions 10..13 into slots 8..11: a new block (4, the head of the free
  // list; the freed 3 went to its tail). At 12 slots (budget + a block) it evicts to 8 again.
  for (int step = 2; step <= 4; ++step) {
    ASSERT_TRUE(e.Step(&st).ok());
    ExpectSlotsHoldTheirPositions(e, runner);
    EXPECT_EQ(e.kv().Table(s->id).blocks, Blocks({1, 2, 4}));
    EXPECT_EQ(st.compactions, 1);
  }
  EXPECT_EQ(s->slot_positions, Concat({0, 1}, Range(4, 13)));
  ASSERT_TRUE(e.Step(&st).ok());
  EXPECT_EQ(s->slot_positions, Concat({0, 1}, Range(8, 14)));
  EXPECT_EQ(e.kv().Table(s->id).blocks, Blocks({1, 2}));
  EXPECT_EQ(e.kv().num_free_blocks(), 13);
  EXPECT_EQ(st.evicted_tokens, 6);
  EXPECT_EQ(st.blocks_freed_by_compaction, 2);
  ExpectSlotsHoldTheirPositions(e, runner);

  // Steps 6..9: positions 14..17 into block 5 (4 went to the tail), evicted at step 9.
  for (int step = 6; step <= 9; ++step) {
    ASSERT_TRUE(e.Step(&st).ok());
    ExpectSlotsHoldTheirPositions(e, runner);
    if (step < 9) {
      EXPECT_EQ(e.kv().Table(s->id).blocks, Blocks({1, 2, 5}));
    }
  }
  EXPECT_EQ(s->slot_positions, Concat({0, 1}, Range(12, 18)));
  EXPECT_EQ(e.kv().Table(s->id).blocks, Blocks({1, 2}));
  EXPECT_EQ(st.evicted_tokens, 10);
  EXPECT_EQ(st.compactions, 3);

  RunToEnd(e);
  EXPECT_EQ(c.tokens[0], ExpectedOutput(Prompt(10, 3), 12));
  EXPECT_EQ(c.finish[0], FinishReason::kLength);
  EXPECT_EQ(e.kv().num_free_blocks(), 15);
}

// A key-reading policy keeps an irregular set: whatever it keeps, the moved slots hold the
// positions the sequence records, the sinks and the window are always there, and it never
// holds more than its budget and a block.
TEST(EvictionEngineFake, KeyDiffMovesIrregularSetsExactly) {
  SlotRecordingRunner runner(40, 4);
  Engine e(FakeConfig(40, "keydiff", 2, 4), runner);
  Collected c[3];
  for (int i = 0; i < 3; ++i) Submit(e, Prompt(13 + 5 * i, i), WithBudget(Greedy(30), 10), &c[i]);
  EngineStepStats st;
  for (int step = 0; step < 200 && e.HasWork(); ++step) {
    ASSERT_TRUE(e.Step(&st).ok());
    ExpectSlotsHoldTheirPositions(e, runner);
    for (const Sequence* s : e.scheduler().running()) {
      if (s->n_evicted == 0) continue;
      EXPECT_LE(s->n_slots(), 10 + 4);
      EXPECT_EQ(std::vector<int32_t>(s->slot_positions.begin(), s->slot_positions.begin() + 2),
                (std::vector<int32_t>{0, 1}));
      EXPECT_EQ(std::vector<int32_t>(s->slot_positions.end() - 4, s->slot_positions.end()),
                Range(s->n_computed - 4, s->n_computed));
    }
  }
  ASSERT_FALSE(e.HasWork());
  EXPECT_GT(st.evicted_tokens, 0);
  EXPECT_GT(runner.n_moves, 0);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(c[i].tokens[0], ExpectedOutput(Prompt(13 + 5 * i, i), 30));
    EXPECT_EQ(c[i].finish[0], FinishReason::kLength);
  }
  EXPECT_EQ(e.kv().num_free_blocks(), e.kv().num_usable_blocks());
}

// n = 3: the prompt is evicted once, before the fork, and the choices share its compacted
// blocks; each then evicts its own tail around the frozen shared prefix.
TEST(EvictionEngineFake, ForkAfterEvictionSharesTheCompactedPrompt) {
  SlotRecordingRunner runner(40, 4);
  Engine e(FakeConfig(40, "streaming", 2, 4), runner);
  Collected c;
  Submit(e, Prompt(10, 5), WithBudget(Greedy(20, 3), 8), &c);
  ASSERT_TRUE(e.Step().ok());
  ASSERT_EQ(e.scheduler().running().size(), 3u);
  for (const Sequence* s : e.scheduler().running()) {
    EXPECT_EQ(s->slot_positions, Concat({0, 1}, Range(4, 10)));
    EXPECT_EQ(e.kv().Table(s->id).blocks, Blocks({1, 2}));
    EXPECT_EQ(e.kv().SharedPrefixSlots(s->id), 8);
  }
  EXPECT_EQ(e.kv().pool().ref_count(BlockId{1}), 3);
  EXPECT_EQ(e.kv().num_free_blocks(), 37);
  ExpectSlotsHoldTheirPositions(e, runner);
  int64_t compactions = 0;
  for (int step = 0; step < 100 && e.HasWork(); ++step) {
    EngineStepStats st;
    ASSERT_TRUE(e.Step(&st).ok());
    compactions = std::max(compactions, st.compactions);
    ExpectSlotsHoldTheirPositions(e, runner);
    for (const Sequence* s : e.scheduler().running()) {
      // The shared blocks stay in place in every choice.
      EXPECT_EQ(std::vector<BlockId>(e.kv().Table(s->id).blocks.begin(),
                                     e.kv().Table(s->id).blocks.begin() + 2),
                Blocks({1, 2}));
      EXPECT_EQ(std::vector<int32_t>(s->slot_positions.begin(), s->slot_positions.begin() + 8),
                Concat({0, 1}, Range(4, 10)));
    }
  }
  ASSERT_FALSE(e.HasWork());
  EXPECT_GT(compactions, 1) << "the choices never evicted past the shared prompt";
  // The shared slots count against the budget (8 + sinks + window = 14), so a choice evicts
  // once it has grown a block past that, not every step (found by a review: 48 compactions).
  EXPECT_LE(compactions, 3 * (20 / 4 + 1));
  for (int ch = 0; ch < 3; ++ch) {
    EXPECT_EQ(c.tokens[ch], ExpectedOutput(Prompt(10, 5), 20)) << "choice " << ch;
    EXPECT_EQ(c.finish[ch], FinishReason::kLength);
  }
  EXPECT_EQ(e.kv().num_free_blocks(), 39);
}

// Sinks of a whole block: block 1 (positions 0..3) is never rewritten, so it stays in the prefix
// index; a second request with the same prompt shares it (frozen for both), and what is
// rewritten never enters the index under the tokens' hashes.
TEST(EvictionEngineFake, PrefixHitSharesOnlyUntouchedBlocks) {
  SlotRecordingRunner runner(40, 4);
  Engine e(FakeConfig(40, "streaming", 4, 4), runner);
  const std::vector<int32_t> prompt = Prompt(20, 7);
  Collected a, b;
  int32_t b_cached = -1;
  Submit(e, prompt, WithBudget(Greedy(16), 12), &a);
  ASSERT_TRUE(e.Step().ok());
  const Sequence* sa = Running(e);
  ASSERT_NE(sa, nullptr);
  EXPECT_EQ(sa->slot_positions, Concat(Range(0, 4), Range(12, 20)));
  ASSERT_EQ(e.kv().Table(sa->id).hashes.size(), 1u);
  const BlockId first = e.kv().Table(sa->id).blocks[0];

  auto id = e.Submit(prompt, WithBudget(Greedy(16), 12), [&](const TokenEvent& ev) {
    if (ev.token >= 0) b.tokens[0].push_back(ev.token);
    if (ev.finished) b.finish[0] = ev.reason;
    b_cached = ev.cached_tokens;
  });
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(e.Step().ok());
  EXPECT_EQ(b_cached, 4) << "only the untouched sink block may be a hit";
  ASSERT_EQ(e.scheduler().running().size(), 2u);
  for (const Sequence* s : e.scheduler().running()) {
    EXPECT_EQ(e.kv().Table(s->id).blocks[0], first);
    EXPECT_EQ(e.kv().SharedPrefixSlots(s->id), 4);
  }
  ExpectSlotsHoldTheirPositions(e, runner);
  for (int step = 0; step < 100 && e.HasWork(); ++step) {
    ASSERT_TRUE(e.Step().ok());
    ExpectSlotsHoldTheirPositions(e, runner);
    for (const Sequence* s : e.scheduler().running()) {
      EXPECT_EQ(e.kv().Table(s->id).blocks[0], first);
    }
  }
  ASSERT_FALSE(e.HasWork());
  EXPECT_EQ(a.tokens[0], ExpectedOutput(prompt, 16));
  EXPECT_EQ(b.tokens[0], ExpectedOutput(prompt, 16));
  EXPECT_EQ(e.kv().num_free_blocks(), 39);

  // The prompt and A's output as a new prompt: only block `first` may be a hit, never a
  // compacted block under the hashes of the tokens it held before.
  Collected d;
  int32_t d_cached = -1;
  const std::vector<int32_t> longer = Concat(prompt, a.tokens[0]);
  ASSERT_TRUE(e.Submit(longer, Greedy(4), [&](const TokenEvent& ev) {
                 if (ev.token >= 0) d.tokens[0].push_back(ev.token);
                 d_cached = ev.cached_tokens;
               }).ok());
  ASSERT_TRUE(e.Step().ok());
  EXPECT_EQ(d_cached, 4);
  ExpectSlotsHoldTheirPositions(e, runner);
  RunToEnd(e);
  EXPECT_EQ(d.tokens[0], ExpectedOutput(longer, 4));
}

// A pool too small for three sequences: preemption recomputes a victim's prompt and output,
// evicts again at the end of that recompute, and everything finishes with the pool whole.
TEST(EvictionEngineFake, PreemptionRecomputesAndEvictsAgain) {
  SlotRecordingRunner runner(9, 4);  // 8 blocks of 4
  Engine e(FakeConfig(9, "streaming", 2, 4), runner);
  // Prompts of different lengths, so that the sequences grow and evict out of phase.
  const int32_t lengths[4] = {9, 6, 11, 7};
  Collected c[4];
  for (int i = 0; i < 4; ++i) {
    Submit(e, Prompt(lengths[i], i), WithBudget(Greedy(14), 8), &c[i]);
  }
  int32_t preempted = 0;
  for (int step = 0; step < 300 && e.HasWork(); ++step) {
    EngineStepStats st;
    ASSERT_TRUE(e.Step(&st).ok());
    preempted += st.n_preempted;
    ExpectSlotsHoldTheirPositions(e, runner);
  }
  ASSERT_FALSE(e.HasWork());
  EXPECT_GT(preempted, 0);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(c[i].tokens[0], ExpectedOutput(Prompt(lengths[i], i), 14));
    EXPECT_EQ(c[i].finish[0], FinishReason::kLength);
  }
  EXPECT_EQ(e.kv().num_free_blocks(), 8);
}

// A request whose whole length the pool could never hold, admitted because with its budget it
// holds at most its prompt or its budget and a block: preempted, it must still finish (its
// recompute of prompt and output must not need more than the pool).
// Found by this test: preemption recomputed prompt + output whole, with no eviction until that
// recompute ended, so a victim whose committed tokens needed more blocks than the pool was never
// readmitted (Engine::HasWork stayed true and nothing was scheduled). A budgeted sequence's
// recompute now comes in chunks under Sequence::max_slots, evicting after each.
TEST(EvictionEngineFake, PreemptedSequenceLongerThanThePoolStillFinishes) {
  SlotRecordingRunner runner(6, 4);  // 5 blocks of 4: 20 positions
  Engine e(FakeConfig(6, "streaming", 2, 4), runner);
  // A runs alone until it has computed 26 positions (it holds at most 12 slots; 8 now)...
  Collected a, b;
  Submit(e, Prompt(9, 0), WithBudget(Greedy(30), 8), &a);
  for (int step = 0; step < 17; ++step) {
    ASSERT_TRUE(e.Step().ok());
    ExpectSlotsHoldTheirPositions(e, runner);
  }
  ASSERT_EQ(a.tokens[0].size(), 17u);
  ASSERT_EQ(e.kv().Table(Running(e)->id).num_tokens, 8);
  // ... then B, of a higher priority and a short prompt, fits beside it; when B grows into a
  // third block, A (last in queue order) is preempted, with more positions to recompute than
  // the whole pool holds.
  RequestOptions high = WithBudget(Greedy(30), 8);
  high.priority = 1;
  Submit(e, Prompt(5, 1), high, &b);
  int32_t preempted = 0;
  for (int step = 0; step < 1000 && e.HasWork(); ++step) {
    EngineStepStats st;
    ASSERT_TRUE(e.Step(&st).ok());
    preempted += st.n_preempted;
    ExpectSlotsHoldTheirPositions(e, runner);
  }
  EXPECT_GT(preempted, 0);
  ASSERT_FALSE(e.HasWork()) << "a preempted sequence never came back";
  EXPECT_EQ(a.tokens[0], ExpectedOutput(Prompt(9, 0), 30));
  EXPECT_EQ(a.finish[0], FinishReason::kLength);
  EXPECT_EQ(b.tokens[0], ExpectedOutput(Prompt(5, 1), 30));
  EXPECT_EQ(b.finish[0], FinishReason::kLength);
  EXPECT_EQ(e.kv().num_free_blocks(), 5);
}

// ------------------------------------------------------------------------------------------
// Bad input.

TEST(EvictionEngineInput, RequestBudgetsBelowTheGuardsOrOverAHundredPercentAreRefused) {
  SlotRecordingRunner runner(64, 16);
  EngineConfig cfg = FakeConfig(64, "keydiff", 4, 32);
  cfg.block_size = 16;
  Engine e(cfg, runner);
  const std::vector<int32_t> prompt = Prompt(10, 1);
  for (const KvBudget bad : {KvBudget{35, false}, KvBudget{1, false}, KvBudget{101, true},
                             KvBudget{-3, false}, KvBudget{-1, true},
                             // Over 100% by its tenths, or tenths ParseKvBudget never makes.
                             KvBudget{100, true, 5}, KvBudget{12, true, 10}, KvBudget{12, true, -1},
                             KvBudget{40, false, 5}}) {
    RequestOptions o = Greedy(8);
    o.kv_budget = bad;
    const Status st = e.ValidateRequest(prompt, o);
    EXPECT_FALSE(st.ok()) << bad.ToString();
    EXPECT_NE(st.message().find("kv_budget"), std::string::npos) << st.message();
    EXPECT_FALSE(e.Submit(prompt, o, nullptr).ok());
  }
  for (const KvBudget good :
       {KvBudget{36, false}, KvBudget{100, true}, KvBudget{1, true}, KvBudget{}}) {
    RequestOptions o = Greedy(8);
    o.kv_budget = good;
    const Status st = e.ValidateRequest(prompt, o);
    EXPECT_TRUE(st.ok()) << good.ToString() << ": " << st.message();
  }
  EXPECT_FALSE(e.HasWork());
}

TEST(EvictionEngineInput, ConfigValidateNamesTheBadSetting) {
  EvictionConfig ok;
  EXPECT_TRUE(ok.Validate().ok());
  EvictionConfig every = ok;
  every.every = -1;
  EXPECT_NE(every.Validate().message().find("--evict-every"), std::string::npos);
  EvictionConfig policy = ok;
  policy.policy = "lru-ish";
  const Status st = policy.Validate();
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("lru-ish"), std::string::npos) << st.message();
  EvictionConfig tri = ok;
  tri.policy = "tri";  // made by the builder, with its calibration
  EXPECT_TRUE(tri.Validate().ok());
  EvictionConfig small = ok;
  small.budget = KvBudget{10, false};
  EXPECT_NE(small.Validate().message().find("--kv-budget"), std::string::npos);
  EvictionConfig sink = ok;
  sink.guard.sink = -1;
  EXPECT_NE(sink.Validate().message().find("--kv-sink"), std::string::npos);
  EvictionConfig window = ok;
  window.guard.window = -1;
  EXPECT_NE(window.Validate().message().find("--kv-window"), std::string::npos);
  EngineConfig engine;
  engine.n_blocks = 64;
  engine.eviction = every;
  EXPECT_FALSE(engine.Validate().ok());
}

TEST(EvictionEngineInput, ParseKvBudget) {
  const EvictionGuard guard{4, 32};
  struct Good {
    const char* text;
    int32_t value;
    bool percent;
  };
  for (const Good g : {Good{"1024", 1024, false}, Good{"36", 36, false}, Good{"25%", 25, true},
                       Good{"100%", 100, true}, Good{"1%", 1, true}, Good{"", 0, false},
                       Good{"0", 0, false}, Good{"0%", 0, false}}) {
    auto b = ParseKvBudget(g.text, guard);
    ASSERT_TRUE(b.ok()) << g.text << ": " << b.error();
    EXPECT_EQ(b->value, g.value) << g.text;
    EXPECT_EQ(b->percent, g.percent) << g.text;
    EXPECT_EQ(b->active(), g.value > 0) << g.text;
  }
  for (const char* bad :
       {"35", "-1", "101%", "-5%", "abc", "12x", "%", "1.5", " 64", "64 ", "99999999999", "25%%"}) {
    auto b = ParseKvBudget(bad, guard, "kv_budget");
    ASSERT_FALSE(b.ok()) << bad;
    EXPECT_NE(b.status().message().find("kv_budget"), std::string::npos) << b.status().message();
  }
  EXPECT_NE(ParseKvBudget("10", guard).status().message().find("--kv-sink"), std::string::npos);
  EXPECT_EQ((KvBudget{25, true}).For(100, guard), 36) << "never below sink + window";
  EXPECT_EQ((KvBudget{25, true}).For(400, guard), 100);
  EXPECT_EQ((KvBudget{50, false}).For(10, guard), 50);
  EXPECT_EQ((KvBudget{25, true}).ToString(), "25%");
}

}  // namespace
}  // namespace kvs
