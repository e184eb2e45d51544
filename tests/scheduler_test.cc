// The scheduler and engine with a fake model runner: exact plans step by step (chunked prefill,
// token budget, decode first, admission, preemption and resume, cancellation, fairness, forks),
// with the KV bookkeeping verified after every step.
#include <gtest/gtest.h>

#include <map>
#include <vector>

#include "engine/async_engine.h"
#include "engine/engine.h"
#include "testing/fake_model.h"

#include <condition_variable>
#include <mutex>
#include <thread>

namespace kvs {
namespace {

// The fake model and its helpers (testing/fake_model.h).
using namespace testing;  // NOLINT(google-build-using-namespace)

struct RunRecord {
  int64_t seq;  // SeqId::value
  int32_t n_computed;
  int32_t n_tokens;
  bool operator==(const RunRecord&) const = default;
};

class FakeRunner final : public StepRunner {
 public:
  int32_t n_vocab() const override { return kVocab; }
  Status CopyBlocks(std::span<const BlockCopy> c) override {
    copies.insert(copies.end(), c.begin(), c.end());
    return Status::Ok();
  }
  Status Execute(const StepBatch& step, StepOutput* out) override {
    mirror.Apply(step);
    mirror.ExpectSlotsMatchTables(step);
    KVS_RETURN_IF_ERROR(sampler_.Apply(step));
    if (clock_ms != nullptr) {  // a step costs step_ms + 1 ms a token on the test's clock
      *clock_ms += step_ms;
      for (const StepRun& r : step.runs) *clock_ms += r.n_tokens;
    }
    steps.emplace_back();
    copies.insert(copies.end(), step.copies.begin(), step.copies.end());
    logits_.assign(static_cast<size_t>(step.n_logit_rows) * kVocab, 0.f);
    int32_t row = 0;
    for (const StepRun& r : step.runs) {
      steps.back().push_back({r.seq, r.first_position, r.n_tokens});
      // The tables must already hold the slots this step writes.
      EXPECT_GE(static_cast<int64_t>(mirror.table(r.seq).size()) * step.block_size,
                r.n_cached + r.n_tokens);
      if (r.n_logits == 0) continue;  // the scheduler wants no logits of this run
      float* row_logits = logits_.data() + static_cast<size_t>(row++) * kVocab;
      row_logits[NextToken(mirror.tokens(r.seq), r.first_position + r.n_tokens)] = 10.f;
    }
    return sampler_.Sample(step, logits_.data(), out);
  }
  RunnerMirror mirror;
  StepSampler sampler_{kVocab};
  std::vector<float> logits_;
  std::vector<std::vector<RunRecord>> steps;
  std::vector<BlockCopy> copies;
  double* clock_ms = nullptr;
  double step_ms = 0;
};

EngineConfig Config(int32_t n_blocks, int32_t block_size, int32_t max_seqs, int32_t budget) {
  EngineConfig c;
  c.n_ctx = 256;
  c.n_blocks = n_blocks;
  c.block_size = block_size;
  c.max_seqs = max_seqs;
  c.max_batch_tokens = budget;
  c.watermark_blocks = 0;
  c.verify_each_step = true;
  return c;
}

TEST(Scheduler, ChunkedPrefillThenOneTokenPerStep) {
  FakeRunner runner;
  Engine e(Config(32, 16, 4, 8), runner);
  Collected c;
  Submit(e, Prompt(20, 1), Greedy(3), &c);
  RunToEnd(e);
  // Seq 1: the prompt in chunks of 8, 8, 4 (the last samples), then 2 decodes.
  const std::vector<std::vector<RunRecord>> want = {
      {{1, 0, 8}}, {{1, 8, 8}}, {{1, 16, 4}}, {{1, 20, 1}}, {{1, 21, 1}}};
  EXPECT_EQ(runner.steps, want);
  EXPECT_EQ(c.tokens[0], ExpectedOutput(Prompt(20, 1), 3));
  EXPECT_EQ(c.finish[0], FinishReason::kLength);
  EXPECT_EQ(e.kv().num_free_blocks(), 31);
}

TEST(Scheduler, TokenBudgetDecodesFirstThenPrefillThenAdmissions) {
  FakeRunner runner;
  Engine e(Config(32, 16, 4, 8), runner);
  Collected a, b, c;
  Submit(e, Prompt(6, 1), Greedy(4), &a);  // seq 1
  Submit(e, Prompt(6, 2), Greedy(4), &b);  // seq 2
  Submit(e, Prompt(6, 3), Greedy(4), &c);  // seq 3
  ASSERT_TRUE(e.Step().ok());
  ASSERT_TRUE(e.Step().ok());
  ASSERT_TRUE(e.Step().ok());
  const std::vector<std::vector<RunRecord>> want = {
      {{1, 0, 6}, {2, 0, 2}},             // A whole, B's first chunk: budget 8 used
      {{1, 6, 1}, {2, 2, 4}, {3, 0, 3}},  // A decodes first, B finishes its prompt, C starts
      {{1, 7, 1}, {2, 6, 1}, {3, 3, 3}},
  };
  EXPECT_EQ(runner.steps, want);
  RunToEnd(e);
  for (const auto& step : runner.steps) {
    int32_t n = 0;
    for (const RunRecord& r : step) n += r.n_tokens;
    EXPECT_LE(n, 8);
  }
  EXPECT_EQ(a.tokens[0], ExpectedOutput(Prompt(6, 1), 4));
  EXPECT_EQ(b.tokens[0], ExpectedOutput(Prompt(6, 2), 4));
  EXPECT_EQ(c.tokens[0], ExpectedOutput(Prompt(6, 3), 4));
}

TEST(Scheduler, ParallelLimitAdmitsInArrivalOrder) {
  FakeRunner runner;
  Engine e(Config(64, 16, 2, 64), runner);
  Collected r[4];
  for (int i = 0; i < 4; ++i) Submit(e, Prompt(4, i), Greedy(3 + i), &r[i]);
  ASSERT_TRUE(e.Step().ok());
  EXPECT_EQ(e.scheduler().running().size(), 2u);
  EXPECT_EQ(e.scheduler().waiting().size(), 2u);
  EXPECT_EQ(runner.steps[0], (std::vector<RunRecord>{{1, 0, 4}, {2, 0, 4}}));
  RunToEnd(e);
  // Seq 1 ends after 3 tokens (3 steps); seq 3 takes its seat in the next step, seq 4 after seq 2.
  EXPECT_EQ(runner.steps[3], (std::vector<RunRecord>{{2, 6, 1}, {3, 0, 4}}));
  EXPECT_EQ(runner.steps[4], (std::vector<RunRecord>{{3, 4, 1}, {4, 0, 4}}));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(r[i].tokens[0], ExpectedOutput(Prompt(4, i), 3 + i));
}

TEST(Scheduler, PriorityGoesFirstAndFcfsWithinAPriority) {
  FakeRunner runner;
  Engine e(Config(64, 16, 1, 64), runner);
  Collected r[3];
  RequestOptions low = Greedy(1), high = Greedy(1);
  high.priority = 5;
  Submit(e, Prompt(4, 0), low, &r[0]);   // seq 1
  Submit(e, Prompt(4, 1), low, &r[1]);   // seq 2
  Submit(e, Prompt(4, 2), high, &r[2]);  // seq 3
  RunToEnd(e);
  ASSERT_EQ(runner.steps.size(), 3u);
  EXPECT_EQ(runner.steps[0][0].seq, 3);
  EXPECT_EQ(runner.steps[1][0].seq, 1);
  EXPECT_EQ(runner.steps[2][0].seq, 2);
}

TEST(Scheduler, AdmissionWaitsForBlocksAndKeepsTheWatermark) {
  FakeRunner runner;
  EngineConfig cfg = Config(7, 4, 4, 64);  // 6 usable blocks of 4
  cfg.watermark_blocks = 1;
  Engine e(cfg, runner);
  Collected a, b;
  Submit(e, Prompt(10, 0), Greedy(2), &a);  // 3 blocks, room for its output
  Submit(e, Prompt(6, 1), Greedy(2), &b);   // 2 blocks
  ASSERT_TRUE(e.Step().ok());
  // Both fit: 3 + 2 = 5 blocks leaves 1 free, the watermark.
  EXPECT_EQ(runner.steps[0], (std::vector<RunRecord>{{1, 0, 10}, {2, 0, 6}}));
  Collected c;
  Submit(e, Prompt(4, 2), Greedy(1), &c);  // 1 block would leave 0 < watermark: waits
  ASSERT_TRUE(e.Step().ok());
  EXPECT_EQ(runner.steps[1], (std::vector<RunRecord>{{1, 10, 1}, {2, 6, 1}}));
  EXPECT_EQ(e.scheduler().waiting().size(), 1u);
  RunToEnd(e);
  EXPECT_EQ(c.tokens[0], ExpectedOutput(Prompt(4, 2), 1));
}

TEST(Scheduler, PreemptionByRecomputeResumesWithTheSameOutput) {
  FakeRunner runner;
  EngineConfig cfg = Config(6, 4, 4, 64);  // 5 usable blocks of 4 positions
  cfg.prefix_cache = false;                // a plain recompute from position 0
  Engine e(cfg, runner);
  Collected a, b;
  Submit(e, Prompt(4, 0), Greedy(12), &a);  // seq 1 grows to 16 positions: 4 blocks
  Submit(e, Prompt(4, 1), Greedy(12), &b);  // seq 2 too: both cannot fit at once
  RunToEnd(e);
  EXPECT_EQ(a.tokens[0], ExpectedOutput(Prompt(4, 0), 12));
  EXPECT_EQ(b.tokens[0], ExpectedOutput(Prompt(4, 1), 12));
  // Seq 2 (the later arrival) was preempted and later recomputed from position 0 with its
  // output so far: one run starting at 0 with more tokens than its prompt.
  bool recomputed = false;
  for (const auto& step : runner.steps) {
    for (const RunRecord& r : step) {
      if (r.seq == 2 && r.n_computed == 0 && r.n_tokens > 4) recomputed = true;
    }
  }
  EXPECT_TRUE(recomputed);
  EXPECT_EQ(e.kv().num_free_blocks(), 5);
}

// The runner forgets every sequence that ended (finished, cancelled, forked choices), so its
// per-sequence state (tables, samplers, histories) does not grow with the requests served.
TEST(Scheduler, TheRunnerForgetsEverySequenceThatEnds) {
  FakeRunner runner;
  Engine e(Config(64, 4, 4, 64), runner);
  Collected a, b, c;
  Submit(e, Prompt(9, 1), Greedy(5, /*n=*/3), &a);
  const RequestId cancelled = Submit(e, Prompt(12, 2), Greedy(40), &b);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(e.Step().ok());
  EXPECT_TRUE(e.Cancel(cancelled));
  RunToEnd(e);
  EXPECT_EQ(a.tokens.size(), 3u);
  // The next request's first batch tells the runner to forget all of them.
  Submit(e, Prompt(5, 3), Greedy(2), &c);
  RunToEnd(e);
  EXPECT_EQ(runner.mirror.size(), 1u);
  EXPECT_EQ(runner.sampler_.num_sequences(), 1u);
}

TEST(Scheduler, PrefixCacheSharesPromptsAndShortensRecompute) {
  FakeRunner runner;
  Engine e(Config(32, 4, 4, 64), runner);
  Collected a, b;
  std::vector<int32_t> shared = Prompt(10, 0);  // 2 full blocks + 2 tokens
  Submit(e, shared, Greedy(2), &a);
  RunToEnd(e);
  // The same prompt again: its two full blocks (8 tokens) are cached; only 2 tokens run.
  Submit(e, shared, Greedy(2), &b);
  ASSERT_TRUE(e.Step().ok());
  EXPECT_EQ(runner.steps.back(), (std::vector<RunRecord>{{2, 8, 2}}));
  RunToEnd(e);
  EXPECT_EQ(b.tokens[0], a.tokens[0]);
  EXPECT_EQ(b.tokens[0], ExpectedOutput(shared, 2));
  EXPECT_TRUE(e.kv().VerifyIntegrity().ok());
}

TEST(Scheduler, CancelFreesBlocksAtOnce) {
  FakeRunner runner;
  Engine e(Config(32, 16, 4, 64), runner);
  Collected a, b;
  const RequestId ia = Submit(e, Prompt(40, 0), Greedy(50), &a);
  Submit(e, Prompt(10, 1), Greedy(5), &b);
  ASSERT_TRUE(e.Step().ok());
  ASSERT_TRUE(e.Step().ok());
  EXPECT_EQ(e.kv().num_free_blocks(), 31 - 3 - 1);
  EXPECT_TRUE(e.Cancel(ia));
  EXPECT_EQ(e.kv().num_free_blocks(), 31 - 1);
  EXPECT_TRUE(e.kv().VerifyIntegrity().ok());
  EXPECT_EQ(a.finish[0], FinishReason::kCancelled);
  EXPECT_EQ(a.tokens[0].size(), 2u);  // one from the prefill, one from the decode
  EXPECT_FALSE(e.Cancel(ia));
  RunToEnd(e);
  EXPECT_EQ(b.tokens[0], ExpectedOutput(Prompt(10, 1), 5));
  EXPECT_EQ(e.kv().num_free_blocks(), 31);
}

TEST(Scheduler, ForkSharesThePromptAndCopiesThePartialBlockOnWrite) {
  FakeRunner runner;
  Engine e(Config(32, 4, 4, 64), runner);
  Collected c;
  Submit(e, Prompt(6, 0), Greedy(3, /*n=*/3), &c);  // 6 positions: blocks 1, 2 (half full)
  ASSERT_TRUE(e.Step().ok());
  // One prefill, then three choices sharing both blocks.
  EXPECT_EQ(runner.steps[0], (std::vector<RunRecord>{{1, 0, 6}}));
  EXPECT_EQ(e.scheduler().running().size(), 3u);
  EXPECT_EQ(e.kv().pool().ref_count(BlockId{1}), 3);
  EXPECT_EQ(e.kv().pool().ref_count(BlockId{2}), 3);
  ASSERT_TRUE(e.Step().ok());
  // The first two writers copy the shared partial block; the last one then holds it alone.
  EXPECT_EQ(runner.copies,
            (std::vector<BlockCopy>{{BlockId{2}, BlockId{3}}, {BlockId{2}, BlockId{4}}}));
  EXPECT_EQ(e.kv().Table(SeqId{1}).blocks, (std::vector<BlockId>{BlockId{1}, BlockId{3}}));
  EXPECT_EQ(e.kv().Table(SeqId{2}).blocks, (std::vector<BlockId>{BlockId{1}, BlockId{4}}));
  EXPECT_EQ(e.kv().Table(SeqId{3}).blocks, (std::vector<BlockId>{BlockId{1}, BlockId{2}}));
  RunToEnd(e);
  for (int32_t choice = 0; choice < 3; ++choice) {
    EXPECT_EQ(c.tokens[choice], ExpectedOutput(Prompt(6, 0), 3)) << choice;  // greedy: all the same
  }
  EXPECT_EQ(e.kv().num_free_blocks(), 31);
}

TEST(Scheduler, CancellingBeforeTheForkEndsEveryChoice) {
  FakeRunner runner;
  Engine e(Config(32, 4, 4, 4), runner);
  Collected c;
  const RequestId id = Submit(e, Prompt(10, 0), Greedy(3, /*n=*/3), &c);
  ASSERT_TRUE(e.Step().ok());  // 4 of 10 prompt tokens: not forked yet
  EXPECT_EQ(e.scheduler().running().size(), 1u);
  EXPECT_TRUE(e.Cancel(id));
  ASSERT_EQ(c.finish.size(), 3u);
  for (int32_t choice = 0; choice < 3; ++choice)
    EXPECT_EQ(c.finish[choice], FinishReason::kCancelled);
  EXPECT_EQ(e.kv().num_free_blocks(), 31);
}

TEST(Scheduler, StopTokenAndContextEndFinishRequests) {
  FakeRunner runner;
  EngineConfig cfg = Config(32, 16, 4, 64);
  cfg.n_ctx = 10;
  Engine e(cfg, runner);
  Collected a, b;
  RequestOptions stop = Greedy(50);
  const std::vector<int32_t> expected = ExpectedOutput(Prompt(4, 3), 3);
  stop.stop_ids = {expected[2]};
  Submit(e, Prompt(4, 3), stop, &a);
  Submit(e, Prompt(4, 4), Greedy(-1), &b);
  RunToEnd(e);
  EXPECT_EQ(a.tokens[0], expected);
  EXPECT_EQ(a.finish[0], FinishReason::kStop);
  EXPECT_EQ(b.tokens[0].size(), 6u);  // 4 + 6 = the context of 10
  EXPECT_EQ(b.finish[0], FinishReason::kLength);
}

TEST(Scheduler, BadRequestsAreRefusedWithAMessage) {
  FakeRunner runner;
  EngineConfig cfg = Config(5, 16, 2, 64);  // 4 blocks = 64 positions
  cfg.n_ctx = 100;
  Engine e(cfg, runner);
  auto msg = [&](std::vector<int32_t> prompt, RequestOptions o) {
    auto r = e.Submit(std::move(prompt), o, {});
    return r.ok() ? std::string() : r.error();
  };
  EXPECT_NE(msg({}, Greedy(1)).find("empty"), std::string::npos);
  EXPECT_NE(msg({5, 99}, Greedy(1)).find("vocabulary"), std::string::npos);
  EXPECT_NE(msg(std::vector<int32_t>(100, 3), Greedy(1)).find("context"), std::string::npos);
  EXPECT_NE(msg({3}, Greedy(0)).find("max_tokens"), std::string::npos);
  EXPECT_NE(msg({3}, Greedy(1, 3)).find("-np"), std::string::npos);
  EXPECT_NE(msg({3}, Greedy(80)).find("--kv-memory"), std::string::npos);
  RequestOptions hot = Greedy(1);
  hot.sampling.temperature = -1;
  EXPECT_NE(msg({3}, hot).find("temperature"), std::string::npos);
  EXPECT_FALSE(e.HasWork());
}

// --- The scheduler alone, on sequences built by hand (drafts in flight have no engine yet).

std::unique_ptr<Sequence> MakeSequence(int64_t id, std::vector<int32_t> prompt,
                                       const BlockHash& key, int32_t priority = 0) {
  auto seq = std::make_unique<Sequence>();
  seq->id = SeqId{id};
  seq->arrival = id;
  seq->priority = priority;
  seq->n_prompt = static_cast<int32_t>(prompt.size());
  seq->tokens = std::move(prompt);
  seq->cache_key = key;
  return seq;
}

// What Engine::Step does for a run once it is computed (sampling aside).
void Computed(KvCacheManager& kv, Sequence* seq, int32_t n_tokens) {
  seq->n_computed += n_tokens;
  kv.HashFullBlocks(seq->tokens.data(), seq->n_committed(), seq->cache_key, &seq->block_hashes);
  kv.CommitFullBlocks(seq->id, seq->block_hashes, seq->n_computed);
}

struct PlannedRun {
  int64_t seq;
  int32_t n_tokens;
  int32_t n_logits;
  bool operator==(const PlannedRun&) const = default;
};
std::vector<PlannedRun> Runs(const SchedulePlan& plan) {
  std::vector<PlannedRun> runs;
  for (const ScheduledRun& r : plan.runs) runs.push_back({r.seq->id.value, r.n_tokens, r.n_logits});
  return runs;
}

TEST(Scheduler, PlanLooksUpWaitingPromptsWithTheHashesKeptFromQueueing) {
  KvCacheManager kv(33, 4);
  kv.set_prefix_caching(true);
  const BlockHash key = PrefixCacheKey("model", "f32", "");
  const std::vector<int32_t> prompt = Prompt(10, 0);
  // A finished sequence left the prompt's two full blocks (1, 2) in the index.
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(kv.Append(SeqId{99}, 10, &copies));
  std::vector<BlockHash> done;
  kv.HashFullBlocks(prompt.data(), 10, key, &done);
  kv.CommitFullBlocks(SeqId{99}, done, 10);
  kv.Free(SeqId{99});

  Scheduler sched(SchedulerConfig{4, 64, 0}, kv);
  auto seq = MakeSequence(1, prompt, key);
  const int64_t hashed = kv.num_blocks_hashed();
  sched.AddWaiting(seq.get());
  EXPECT_EQ(kv.num_blocks_hashed(), hashed + 2);  // hashed once, when queued
  EXPECT_EQ(seq->block_hashes, done);
  const PrefixMatch fresh = kv.Match(prompt.data(), 10, key);  // the token-list lookup
  for (int step = 0; step < 3; ++step) {  // planning does not mutate: the same plan each time
    const int64_t before = kv.num_blocks_hashed();
    const SchedulePlan plan = sched.Plan();
    EXPECT_EQ(kv.num_blocks_hashed(), before);  // Plan hashes nothing
    ASSERT_EQ(plan.admit_prefix.size(), 1u);
    const PrefixMatch& m = plan.admit_prefix[0];
    EXPECT_EQ(m.blocks, (std::vector<BlockId>{BlockId{1}, BlockId{2}}));
    EXPECT_EQ(m.blocks, fresh.blocks);
    EXPECT_EQ(m.hashes, fresh.hashes);
    EXPECT_EQ(m.n_tokens, fresh.n_tokens);
    EXPECT_EQ(m.n_free, fresh.n_free);
    EXPECT_EQ(Runs(plan), (std::vector<PlannedRun>{{1, 2, 1}}));  // the 2 uncached tokens
  }
  // Running it adds no hash either: the blocks the run fills were hashed at queueing.
  const int64_t before = kv.num_blocks_hashed();
  sched.Apply(sched.Plan(), &copies);
  Computed(kv, seq.get(), 2);
  EXPECT_EQ(kv.num_blocks_hashed(), before);
  EXPECT_TRUE(kv.VerifyIntegrity().ok());
}

// --- Stall-free batching (--max-step-ms): the step token cap.

TEST(StallFree, DecodesAllRunAndPromptsShareWhatTheCapLeaves) {
  KvCacheManager kv(65, 16);
  Scheduler sched(SchedulerConfig{8, 256, 0}, kv);
  const BlockHash key = PrefixCacheKey("model", "f32", "");
  auto a = MakeSequence(1, Prompt(4, 1), key);
  auto b = MakeSequence(2, Prompt(4, 2), key);
  sched.AddWaiting(a.get());
  sched.AddWaiting(b.get());
  std::vector<BlockCopy> copies;
  sched.Apply(sched.Plan(), &copies);  // both prompts whole
  Computed(kv, a.get(), 4);
  Computed(kv, b.get(), 4);
  a->tokens.push_back(5);  // sampled: both decode now
  b->tokens.push_back(6);
  auto c = MakeSequence(3, Prompt(100, 3), key);
  auto d = MakeSequence(4, Prompt(100, 4), key);
  sched.AddWaiting(c.get());
  sched.AddWaiting(d.get());
  // No cap: the budget of 256 takes both prompts whole beside the decodes.
  EXPECT_EQ(Runs(sched.Plan()),
            (std::vector<PlannedRun>{{1, 1, 1}, {2, 1, 1}, {3, 100, 1}, {4, 100, 1}}));
  // Cap 40: the two decodes, then 38 tokens of c's prompt; d waits (nothing left for it).
  sched.set_step_token_cap(40);
  SchedulePlan plan = sched.Plan();
  EXPECT_EQ(Runs(plan), (std::vector<PlannedRun>{{1, 1, 1}, {2, 1, 1}, {3, 38, 0}}));
  EXPECT_EQ(plan.n_tokens, 40);
  sched.Apply(plan, &copies);
  Computed(kv, a.get(), 1);
  Computed(kv, b.get(), 1);
  Computed(kv, c.get(), 38);
  a->tokens.push_back(7);
  b->tokens.push_back(8);
  // c is a running prefill now: its next chunk comes after the decodes, under the same cap.
  EXPECT_EQ(Runs(sched.Plan()), (std::vector<PlannedRun>{{1, 1, 1}, {2, 1, 1}, {3, 38, 0}}));
  // A cap the decodes alone exceed still gives prompts kMinPrefillTokens a step.
  sched.set_step_token_cap(1);
  EXPECT_EQ(Runs(sched.Plan()),
            (std::vector<PlannedRun>{{1, 1, 1}, {2, 1, 1}, {3, kMinPrefillTokens, 0}}));
  // A cap above what is pending changes nothing.
  sched.set_step_token_cap(1000);
  EXPECT_EQ(Runs(sched.Plan()),
            (std::vector<PlannedRun>{{1, 1, 1}, {2, 1, 1}, {3, 62, 1}, {4, 100, 1}}));
  EXPECT_TRUE(kv.VerifyIntegrity().ok());
}

TEST(StallFree, WithNothingDecodingPromptsTakeTheWholeBudget) {
  KvCacheManager kv(65, 16);
  Scheduler sched(SchedulerConfig{8, 256, 0}, kv);
  sched.set_step_token_cap(40);
  const BlockHash key = PrefixCacheKey("model", "f32", "");
  auto c = MakeSequence(3, Prompt(100, 3), key);
  auto d = MakeSequence(4, Prompt(200, 4), key);
  sched.AddWaiting(c.get());
  sched.AddWaiting(d.get());
  // Nobody decodes, so nobody's inter-token latency is at stake: first tokens come first.
  EXPECT_EQ(Runs(sched.Plan()), (std::vector<PlannedRun>{{3, 100, 1}, {4, 156, 0}}));
}

TEST(StallFree, TheEngineCutsPromptsWhileOthersDecodeAndOutputsStayTheSame) {
  for (const double max_step_ms : {0.0, 1e-6}) {
    SCOPED_TRACE(max_step_ms);
    FakeRunner runner;
    EngineConfig config = Config(64, 16, 4, 64);
    config.max_step_ms = max_step_ms;  // 1e-6: no step fits, so prompts get the floor
    Engine e(config, runner);
    Collected a, b;
    Submit(e, Prompt(6, 1), Greedy(8), &a);   // seq 1
    ASSERT_TRUE(e.Step().ok());               // its prompt; it decodes from now on
    Submit(e, Prompt(40, 2), Greedy(2), &b);  // seq 2
    ASSERT_TRUE(e.Step().ok());
    ASSERT_TRUE(e.Step().ok());
    ASSERT_TRUE(e.Step().ok());
    const std::vector<std::vector<RunRecord>> cut = {
        {{1, 0, 6}},
        {{1, 6, 1}, {2, 0, kMinPrefillTokens}},
        {{1, 7, 1}, {2, 16, kMinPrefillTokens}},
        {{1, 8, 1}, {2, 32, 8}},  // the last chunk samples
    };
    const std::vector<std::vector<RunRecord>> whole = {
        {{1, 0, 6}}, {{1, 6, 1}, {2, 0, 40}}, {{1, 7, 1}, {2, 40, 1}}, {{1, 8, 1}}};
    EXPECT_EQ(runner.steps, max_step_ms > 0 ? cut : whole);
    RunToEnd(e);
    EXPECT_EQ(a.tokens[0], ExpectedOutput(Prompt(6, 1), 8));
    EXPECT_EQ(b.tokens[0], ExpectedOutput(Prompt(40, 2), 2));
  }
}

// Sequence 1 (6 prompt tokens, 8 to generate) runs a step alone and decodes from then on;
// sequence 2 (prompt_2's tokens, 2 to generate) arrives, and `steps` more steps run.
void DecodeThenPrompt(Engine& e, int32_t prompt_2, int steps, Collected* a, Collected* b) {
  Submit(e, Prompt(6, 1), Greedy(8), a);
  ASSERT_TRUE(e.Step().ok());
  Submit(e, Prompt(prompt_2, 2), Greedy(2), b);
  for (int i = 0; i < steps; ++i) ASSERT_TRUE(e.Step().ok());
}

TEST(StallFree, TheStepTargetInMillisecondsMeetsTheStepsMeasuredCost) {
  FakeRunner runner;
  double now_ms = 0;
  runner.clock_ms = &now_ms;  // 1 ms a token
  EngineConfig config = Config(64, 16, 4, 64);
  config.max_step_ms = 20;  // 20 tokens a step, decodes included
  Engine e(config, runner);
  e.set_clock([&now_ms] { return now_ms / 1e3; });
  Collected a, b;
  DecodeThenPrompt(e, 60, 4, &a, &b);
  const std::vector<std::vector<RunRecord>> want = {
      {{1, 0, 6}},
      {{1, 6, 1}, {2, 0, 19}},
      {{1, 7, 1}, {2, 19, 19}},
      {{1, 8, 1}, {2, 38, 19}},
      {{1, 9, 1}, {2, 57, 3}},
  };
  EXPECT_EQ(runner.steps, want);
  EXPECT_NEAR(e.step_cost().per_token(), 0.001, 1e-9);
  EXPECT_NEAR(e.step_cost().intercept(), 0, 1e-9);
  RunToEnd(e);
  EXPECT_EQ(b.tokens[0], ExpectedOutput(Prompt(60, 2), 2));
}

TEST(StallFree, APromptAtMostDoublesTheDecodeStepItJoins) {
  FakeRunner runner;
  double now_ms = 0;
  runner.clock_ms = &now_ms;
  runner.step_ms = 30;  // a step: 30 ms + 1 ms a token
  EngineConfig config = Config(64, 16, 4, 128);
  config.max_step_ms = 100;  // 70 tokens a step
  Engine e(config, runner);
  e.set_clock([&now_ms] { return now_ms / 1e3; });
  Collected a, b;
  // Step 1: 36 ms for 6 tokens, one size, so 6 ms a token and no fixed cost.
  DecodeThenPrompt(e, 100, 5, &a, &b);
  // Step 2 cuts by the target alone (100 ms / 6 ms = 16 tokens); from step 3 the fit is exact
  // (a = 30 ms = 30 tokens): the prompt gets 30 + 1 tokens beside the one decode, not the 69
  // the target leaves, so each step takes 62 ms against the decode's 31 ms.
  const std::vector<std::vector<RunRecord>> want = {
      {{1, 0, 6}},
      {{1, 6, 1}, {2, 0, 16}},
      {{1, 7, 1}, {2, 16, 31}},
      {{1, 8, 1}, {2, 47, 31}},
      {{1, 9, 1}, {2, 78, 22}},  // the last chunk samples
      {{1, 10, 1}, {2, 100, 1}},
  };
  EXPECT_EQ(runner.steps, want);
  EXPECT_NEAR(e.step_cost().intercept(), 0.030, 1e-9);
  EXPECT_EQ(e.step_cost().OverheadTokens(), 30);
  RunToEnd(e);
  EXPECT_EQ(a.tokens[0], ExpectedOutput(Prompt(6, 1), 8));
  EXPECT_EQ(b.tokens[0], ExpectedOutput(Prompt(100, 2), 2));
}

TEST(StallFree, TheOverheadRuleTakesTheSmallerShareAndKeepsTheFloor) {
  KvCacheManager kv(65, 16);
  Scheduler sched(SchedulerConfig{8, 256, 0}, kv);
  const BlockHash key = PrefixCacheKey("model", "f32", "");
  auto a = MakeSequence(1, Prompt(4, 1), key);
  auto b = MakeSequence(2, Prompt(4, 2), key);
  sched.AddWaiting(a.get());
  sched.AddWaiting(b.get());
  std::vector<BlockCopy> copies;
  sched.Apply(sched.Plan(), &copies);
  Computed(kv, a.get(), 4);
  Computed(kv, b.get(), 4);
  a->tokens.push_back(5);
  b->tokens.push_back(6);
  auto c = MakeSequence(3, Prompt(100, 3), key);
  sched.AddWaiting(c.get());
  sched.set_step_token_cap(60);
  sched.set_step_overhead_tokens(25);  // 25 + 2 decodes < 60 - 2
  EXPECT_EQ(Runs(sched.Plan()), (std::vector<PlannedRun>{{1, 1, 1}, {2, 1, 1}, {3, 27, 0}}));
  sched.set_step_overhead_tokens(70);  // the cap is the smaller share
  EXPECT_EQ(Runs(sched.Plan()), (std::vector<PlannedRun>{{1, 1, 1}, {2, 1, 1}, {3, 58, 0}}));
  sched.set_step_overhead_tokens(3);  // 3 + 2 < the floor
  EXPECT_EQ(Runs(sched.Plan()),
            (std::vector<PlannedRun>{{1, 1, 1}, {2, 1, 1}, {3, kMinPrefillTokens, 0}}));
  sched.set_step_token_cap(0);  // the rule alone
  sched.set_step_overhead_tokens(40);
  EXPECT_EQ(Runs(sched.Plan()), (std::vector<PlannedRun>{{1, 1, 1}, {2, 1, 1}, {3, 42, 0}}));
}

TEST(StallFree, PromptsWithAKvBudgetAreNotCutByTheClock) {
  KvCacheManager kv(65, 16);
  Scheduler sched(SchedulerConfig{8, 256, 0}, kv);
  const BlockHash key = PrefixCacheKey("model", "f32", "");
  auto a = MakeSequence(1, Prompt(4, 1), key);
  sched.AddWaiting(a.get());
  std::vector<BlockCopy> copies;
  sched.Apply(sched.Plan(), &copies);
  Computed(kv, a.get(), 4);
  a->tokens.push_back(5);  // decoding
  auto c = MakeSequence(3, Prompt(100, 3), key);
  c->kv_budget = KvBudget{50, false};  // evicts after each chunk: its chunks stay whole
  auto d = MakeSequence(4, Prompt(100, 4), key);
  sched.AddWaiting(c.get());
  sched.AddWaiting(d.get());
  sched.set_step_token_cap(20);
  // c takes its chunk whole (and uses up the prompts' share); d, behind it, waits.
  EXPECT_EQ(Runs(sched.Plan()), (std::vector<PlannedRun>{{1, 1, 1}, {3, 100, 1}}));
}

TEST(Scheduler, DraftsInFlightAreNotAPrefillAndNeedALogitRowEach) {
  KvCacheManager kv(33, 4);
  kv.set_prefix_caching(true);
  const BlockHash key = PrefixCacheKey("model", "f32", "");
  Scheduler sched(SchedulerConfig{4, 8, 0}, kv);
  std::vector<BlockCopy> copies;
  auto d = MakeSequence(1, Prompt(6, 1), key);
  sched.AddWaiting(d.get());
  SchedulePlan plan = sched.Plan();
  EXPECT_EQ(Runs(plan), (std::vector<PlannedRun>{{1, 6, 1}}));  // a whole prompt: its last row
  sched.Apply(plan, &copies);
  Computed(kv, d.get(), 6);
  d->tokens.push_back(7);  // sampled
  // A higher-priority prompt arrives: it runs ahead of d in queue order.
  auto p = MakeSequence(2, Prompt(20, 2), key, /*priority=*/5);
  sched.AddWaiting(p.get());
  plan = sched.Plan();
  EXPECT_EQ(Runs(plan),
            (std::vector<PlannedRun>{{1, 1, 1}, {2, 7, 0}}));  // a middle chunk: no rows
  sched.Apply(plan, &copies);
  Computed(kv, d.get(), 1);
  Computed(kv, p.get(), 7);
  d->tokens.push_back(8);  // sampled, committed: 8 tokens, 7 computed
  // Five drafts in flight after it: d still decodes (one committed token left), so it goes
  // before p's prefill chunk, with a row for its last committed token and one per draft.
  d->tokens.insert(d->tokens.end(), {9, 10, 11, 12, 13});
  d->n_in_flight = 5;
  EXPECT_FALSE(d->in_prefill());
  EXPECT_EQ(d->n_committed(), 8);
  EXPECT_EQ(d->n_output(), 2);
  EXPECT_EQ(d->n_pending(), 6);
  EXPECT_TRUE(p->in_prefill());
  EXPECT_EQ(LogitRows(*d, d->n_computed, 3), 3);  // a budget cut: the drafts it reaches
  plan = sched.Plan();
  EXPECT_EQ(Runs(plan), (std::vector<PlannedRun>{{1, 6, 6}, {2, 2, 0}}));
  sched.Apply(plan, &copies);
  const int32_t cached = kv.num_cached_blocks();
  Computed(kv, d.get(), 6);
  // d's second block (positions 4..7, committed) joins the index; its third (8..11) is full
  // and computed too, but holds drafts only: never hashed, never indexed.
  EXPECT_EQ(kv.Table(d->id).num_tokens, 13);
  EXPECT_EQ(kv.Table(d->id).hashes.size(), 2u);
  EXPECT_EQ(d->block_hashes.size(), 2u);
  EXPECT_EQ(kv.num_cached_blocks(), cached + 1);
  // Every draft rejected: d goes back to its committed tokens, the draft blocks to the pool.
  const int32_t free_before = kv.num_free_blocks();
  d->tokens.resize(8);
  d->n_in_flight = 0;
  d->n_computed = 8;
  ASSERT_TRUE(kv.Truncate(d->id, 8).ok());
  EXPECT_EQ(kv.num_free_blocks(), free_before + 2);
  EXPECT_EQ(kv.Table(d->id).blocks.size(), 2u);
  EXPECT_TRUE(kv.VerifyIntegrity().ok());
  d->tokens.push_back(14);  // sampled from the last committed token's row
  plan = sched.Plan();
  EXPECT_EQ(Runs(plan), (std::vector<PlannedRun>{{1, 1, 1}, {2, 7, 0}}));
}

// --- AsyncEngine: the thread-safe front.

struct Waiter {
  std::mutex mu;
  std::condition_variable cv;
  std::map<RequestId, std::vector<int32_t>> tokens;
  std::map<RequestId, FinishReason> finish;
  TokenCallback Callback() {
    return [this](const TokenEvent& e) {
      std::lock_guard<std::mutex> lock(mu);
      if (e.token >= 0) tokens[e.request].push_back(e.token);
      if (e.finished) {
        finish[e.request] = e.reason;
        cv.notify_all();
      }
    };
  }
  void WaitFor(size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return finish.size() >= n; });
  }
};

TEST(AsyncEngine, SubmissionsFromManyThreadsAllComplete) {
  EngineConfig cfg = Config(64, 16, 8, 32);
  AsyncEngine engine(cfg, std::make_unique<FakeRunner>());
  Waiter w;
  std::mutex ids_mu;
  std::map<RequestId, int32_t> seed_of;
  std::vector<std::thread> threads;
  for (int32_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int32_t i = 0; i < 5; ++i) {
        const int32_t seed = t * 10 + i;
        auto id = engine.Submit(Prompt(3 + seed % 7, seed), Greedy(6), w.Callback());
        ASSERT_TRUE(id.ok());
        std::lock_guard<std::mutex> lock(ids_mu);
        seed_of[*id] = seed;
      }
    });
  }
  for (auto& th : threads) th.join();
  w.WaitFor(20);
  ASSERT_EQ(seed_of.size(), 20u);
  for (const auto& [id, seed] : seed_of) {
    EXPECT_EQ(w.tokens[id], ExpectedOutput(Prompt(3 + seed % 7, seed), 6)) << id;
    EXPECT_EQ(w.finish[id], FinishReason::kLength);
  }
  EXPECT_FALSE(engine.Submit({}, Greedy(1), {}).ok());  // still validated synchronously
}

TEST(AsyncEngine, CancelFromACallbackAndShutdownWithWorkLeft) {
  EngineConfig cfg = Config(64, 16, 1, 32);  // one at a time: the rest wait in the queue
  auto engine = std::make_unique<AsyncEngine>(cfg, std::make_unique<FakeRunner>());
  Waiter w;
  AsyncEngine* raw = engine.get();
  RequestId first = 0;
  std::mutex first_mu;
  auto id = raw->Submit(Prompt(4, 0), Greedy(1000), [&](const TokenEvent& e) {
    w.Callback()(e);
    std::lock_guard<std::mutex> lock(first_mu);
    if (e.token >= 0 && w.tokens[e.request].size() == 3) raw->Cancel(e.request);
  });
  ASSERT_TRUE(id.ok());
  first = *id;
  w.WaitFor(1);
  EXPECT_EQ(w.finish[first], FinishReason::kCancelled);
  EXPECT_EQ(w.tokens[first].size(), 3u);
  for (int32_t i = 0; i < 3; ++i)
    ASSERT_TRUE(raw->Submit(Prompt(4, i), Greedy(200), w.Callback()).ok());
  engine->Shutdown();  // must not hang; every request ends with an event
  EXPECT_EQ(w.finish.size(), 4u);
  EXPECT_FALSE(raw->Submit(Prompt(4, 9), Greedy(1), {}).ok());
}

}  // namespace
}  // namespace kvs
