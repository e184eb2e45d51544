// Speculative decoding in the engine, with a fake model and fake drafters: lookahead slots,
// verification rows, rollback by trimming the block table (exact block ids), and greedy output
// identical to plain decoding under batching, chunked prefill, preemption, prefix-cache hits,
// forks, stop tokens and max_tokens. The KV bookkeeping is verified after every step.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

#include "engine/engine.h"
#include "engine/spec/ngram_drafter.h"
#include "engine/spec/spec_policy.h"
#include "testing/fake_model.h"

namespace kvs {
namespace {

// The fake model and its helpers (testing/fake_model.h).
using namespace testing;  // NOLINT(google-build-using-namespace)

struct RunRecord {
  int64_t seq;
  int32_t n_computed;
  int32_t n_tokens;
  int32_t n_logits;
  bool operator==(const RunRecord&) const = default;
};

// Logit row r of a run is the model's next token after the run's position
// n_computed + n_tokens - n_logits + r, over the run's tokens (drafts included).
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
    steps.emplace_back();
    copies.insert(copies.end(), step.copies.begin(), step.copies.end());
    logits_.assign(static_cast<size_t>(step.n_logit_rows) * kVocab, 0.f);
    int32_t row = 0;
    for (const StepRun& r : step.runs) {
      steps.back().push_back({r.seq, r.first_position, r.n_tokens, r.n_logits});
      EXPECT_GE(static_cast<int64_t>(mirror.table(r.seq).size()) * step.block_size,
                r.n_cached + r.n_tokens);
      // A run that samples verifies every draft it carries: one row for the last committed
      // token and one per draft.
      if (r.n_logits > 0) EXPECT_EQ(r.n_logits, r.n_drafts + 1);
      for (int32_t i = 0; i < r.n_logits; ++i) {
        const int32_t pos = r.first_position + r.n_tokens - r.n_logits + i;
        float* row_logits = logits_.data() + static_cast<size_t>(row++) * kVocab;
        row_logits[NextToken(mirror.tokens(r.seq), pos + 1)] = 10.f;
      }
    }
    return sampler_.Sample(step, logits_.data(), out);
  }
  RunnerMirror mirror;
  StepSampler sampler_{kVocab};
  std::vector<float> logits_;
  std::vector<std::vector<RunRecord>> steps;
  std::vector<BlockCopy> copies;
};

// Proposes the model's true continuation, each token wrong with probability `error` (then the
// rest of its drafts continue from the wrong one, as a real draft would).
class FakeDrafter final : public Drafter {
 public:
  explicit FakeDrafter(double error, uint64_t seed = 1) : error_(error), rng_(seed) {}
  std::string_view name() const override { return "fake"; }
  double relative_cost() const override { return 0.0; }
  Status Propose(std::span<const DraftRequest> requests, const KvCacheManager& kv,
                 std::span<Draft> drafts) override {
    for (size_t i = 0; i < requests.size(); ++i) {
      const Sequence& seq = *requests[i].seq;
      EXPECT_EQ(seq.n_computed, seq.n_committed() - 1);
      EXPECT_GE(kv.Table(seq.id).num_tokens, seq.n_committed() + requests[i].max_drafts);
      std::vector<int32_t> t(seq.tokens.begin(), seq.tokens.begin() + seq.n_committed());
      drafts[i].tokens.clear();
      for (int32_t j = 0; j < std::min(requests[i].max_drafts, limit); ++j) {
        int32_t next = NextToken(t, t.size());
        if (std::uniform_real_distribution<double>(0, 1)(rng_) < error_) next = next % 60 + 2;
        t.push_back(next);
        drafts[i].tokens.push_back(next);
      }
      proposed += requests[i].max_drafts;
    }
    return Status::Ok();
  }
  void Release(SeqId) override { ++released; }
  int32_t limit = 1 << 30;  // most drafts proposed per request (an n-gram finds fewer, or none)
  int64_t proposed = 0;
  int64_t released = 0;

 private:
  double error_;
  std::mt19937_64 rng_;
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
  c.spec.draft_max = 4;
  c.spec.draft_min = 4;  // always draft the most: the fake drafts cost nothing
  c.spec.compute_bound_tokens = 1 << 20;
  return c;
}

TEST(SpecEngine, PerfectDraftsVerifyFourAtOnceAndEmitFive) {
  FakeRunner runner;
  FakeDrafter drafter(0.0);
  Engine e(Config(32, 4, 4, 64), runner, &drafter);
  Collected c;
  Submit(e, Prompt(6, 1), Greedy(11), &c);
  RunToEnd(e);
  // The prompt, then rounds of 1 + 4 positions each emitting 5 tokens: 1 + 5 + 5 = 11.
  const std::vector<std::vector<RunRecord>> want = {
      {{1, 0, 6, 1}}, {{1, 6, 5, 5}}, {{1, 11, 5, 5}}};
  EXPECT_EQ(runner.steps, want);
  EXPECT_EQ(c.tokens[0], ExpectedOutput(Prompt(6, 1), 11));
  EXPECT_EQ(c.finish[0], FinishReason::kLength);
  EngineStepStats stats;
  ASSERT_TRUE(e.Step(&stats).ok());
  EXPECT_EQ(e.kv().num_free_blocks(), 31);
}

TEST(SpecEngine, RejectedDraftsAreTrimmedFromTheBlockTable) {
  FakeRunner runner;
  FakeDrafter drafter(1.0);  // every draft wrong
  Engine e(Config(32, 4, 4, 64), runner, &drafter);
  Collected c;
  Submit(e, Prompt(6, 1), Greedy(3), &c);
  ASSERT_TRUE(e.Step().ok());  // the prompt (blocks 1, 2), and the first token sampled
  ASSERT_TRUE(e.Step().ok());
  // After the prompt one token was emitted, 2 remain: one draft at most (the draft and the
  // token after it). It was wrong: position 6 is kept, 7 trimmed, the table covers 7 positions.
  EXPECT_EQ(runner.steps[1], (std::vector<RunRecord>{{1, 6, 2, 2}}));
  const BlockTable& t = e.kv().Table(SeqId{1});
  EXPECT_EQ(t.num_tokens, 7);
  ASSERT_EQ(t.blocks.size(), 2u);
  EXPECT_EQ(e.kv().num_free_blocks(), 29);
  RunToEnd(e);
  EXPECT_EQ(c.tokens[0], ExpectedOutput(Prompt(6, 1), 3));
}

TEST(SpecEngine, LookaheadBlocksPastTheTableReturnToThePool) {
  FakeRunner runner;
  FakeDrafter drafter(1.0);
  Engine e(Config(32, 4, 4, 64), runner, &drafter);
  Collected c;
  Submit(e, Prompt(8, 1), Greedy(20), &c);
  ASSERT_TRUE(e.Step().ok());  // 8 positions: 2 full blocks
  ASSERT_TRUE(e.Step().ok());  // positions 8..12 need blocks 3 and 4; all drafts rejected
  EXPECT_EQ(runner.steps[1], (std::vector<RunRecord>{{1, 8, 5, 5}}));
  EXPECT_EQ(e.kv().Table(SeqId{1}).num_tokens, 9);
  EXPECT_EQ(e.kv().Table(SeqId{1}).blocks,
            (std::vector<BlockId>{BlockId{1}, BlockId{2}, BlockId{3}}));
  EXPECT_EQ(e.kv().num_free_blocks(), 28);
}

// A drafter that proposes fewer drafts than the lookahead it was given (an n-gram lookup
// that finds nothing): the block table shrinks with the run. It used to keep the unused
// lookahead positions for good, 4 a step, until the sequence's table outgrew the pool, it
// preempted itself and the step ran an empty forward pass ("forward pass needs at least one
// token"): bench spec --spec-type ngram -d 200 -c 216 -n 16.
TEST(SpecEngine, LookaheadTheDrafterLeavesUnusedIsNotKept) {
  for (int32_t limit : {0, 1}) {
    FakeRunner runner;
    FakeDrafter drafter(0.0);
    drafter.limit = limit;
    Engine e(Config(8, 4, 4, 64), runner, &drafter);  // 7 usable blocks: 28 positions
    Collected c;
    Submit(e, Prompt(8, 1), Greedy(20), &c);
    ASSERT_TRUE(e.Step().ok());  // the prompt, and the first token
    ASSERT_TRUE(e.Step().ok());  // lookahead 4, drafts `limit`
    EXPECT_EQ(runner.steps[1], (std::vector<RunRecord>{{1, 8, 1 + limit, 1 + limit}}));
    EXPECT_EQ(e.kv().Table(SeqId{1}).num_tokens, 9 + limit);
    EXPECT_EQ(e.kv().Table(SeqId{1}).blocks.size(), 3u);
    RunToEnd(e);
    EXPECT_EQ(c.tokens[0], ExpectedOutput(Prompt(8, 1), 20)) << "limit " << limit;
    EXPECT_EQ(c.finish[0], FinishReason::kLength);
    for (const auto& step : runner.steps) EXPECT_FALSE(step.empty()) << "limit " << limit;
    EXPECT_EQ(e.kv().num_free_blocks(), 7);
  }
}

// Greedy output token for token as without speculation, across batching, chunked prefill,
// preemption (a pool too small for all), prefix-cache hits (repeated prompts), forks, a stop
// token and max_tokens — with drafts wrong a third of the time.
TEST(SpecEngine, GreedyOutputIsUnchangedUnderEveryEngineFeature) {
  for (int32_t pool : {12, 64}) {
    for (double error : {0.0, 0.35, 1.0}) {
      FakeRunner runner;
      FakeDrafter drafter(error, 7);
      Engine e(Config(pool, 4, 8, 16), runner, &drafter);
      std::vector<Collected> got(8);
      std::vector<std::pair<std::vector<int32_t>, RequestOptions>> reqs;
      for (int i = 0; i < 8; ++i) {
        std::vector<int32_t> prompt = Prompt(5 + 3 * (i % 4), i % 3);  // repeats: cache hits
        RequestOptions o = Greedy(6 + i, i == 5 ? 2 : 1);
        if (i == 3) o.stop_ids = {ExpectedOutput(prompt, 4)[3]};  // stops at its 4th token
        reqs.emplace_back(prompt, o);
        Submit(e, prompt, o, &got[i]);
      }
      RunToEnd(e);
      for (int i = 0; i < 8; ++i) {
        const auto& [prompt, o] = reqs[i];
        const int32_t n = i == 3 ? 4 : o.max_tokens;
        for (int32_t ch = 0; ch < o.n; ++ch) {
          EXPECT_EQ(got[i].tokens[ch], ExpectedOutput(prompt, n))
              << "request " << i << " choice " << ch << " pool " << pool << " error " << error;
        }
        EXPECT_EQ(got[i].finish[0], i == 3 ? FinishReason::kStop : FinishReason::kLength);
      }
      EXPECT_EQ(e.kv().num_free_blocks(), pool - 1);
      EXPECT_GT(drafter.proposed, 0);
      if (pool == 12) {
        EXPECT_GT(e.scheduler().prefix_queries(), 0);
      }
    }
  }
}

TEST(SpecEngine, MetricsCountDraftsAndAcceptedTokens) {
  FakeRunner runner;
  FakeDrafter drafter(0.0);
  Engine e(Config(32, 4, 4, 64), runner, &drafter);
  Collected c;
  Submit(e, Prompt(6, 1), Greedy(11), &c);
  EngineStepStats stats;
  while (e.HasWork()) ASSERT_TRUE(e.Step(&stats).ok());
  EXPECT_EQ(stats.spec_drafts, 2);
  EXPECT_EQ(stats.spec_draft_tokens, 8);
  EXPECT_EQ(stats.spec_accepted_tokens, 8);
}

TEST(SpecEngine, RequestsThatOptOutNeverDraft) {
  FakeRunner runner;
  FakeDrafter drafter(0.0);
  Engine e(Config(32, 4, 4, 64), runner, &drafter);
  Collected c;
  RequestOptions o = Greedy(5);
  o.speculative = false;
  Submit(e, Prompt(6, 1), o, &c);
  RunToEnd(e);
  EXPECT_EQ(drafter.proposed, 0);
  EXPECT_EQ(c.tokens[0], ExpectedOutput(Prompt(6, 1), 5));
}

TEST(SpecEngine, BudgetCutsTheDraftsNotTheDecode) {
  FakeRunner runner;
  FakeDrafter drafter(0.0);
  Engine e(Config(32, 4, 4, 3), runner, &drafter);  // 3 tokens a step
  Collected c;
  Submit(e, Prompt(3, 1), Greedy(6), &c);
  RunToEnd(e);
  EXPECT_EQ(runner.steps[1], (std::vector<RunRecord>{{1, 3, 3, 3}}));  // 1 + 2 drafts
  EXPECT_EQ(c.tokens[0], ExpectedOutput(Prompt(3, 1), 6));
}

TEST(Ngram, ProposesWhatFollowedTheLatestEarlierMatch) {
  const std::vector<int32_t> t = {5, 6, 7, 8, 9, 1, 5, 6, 7, 3, 4, 5, 6, 7};
  // Suffix 5 6 7 occurs at 6 (followed by 3 4) and at 0 (followed by 8 9): the latest wins.
  EXPECT_EQ(LookupNgram(t, 3, 2, 4), (std::vector<int32_t>{3, 4, 5}));
  EXPECT_EQ(LookupNgram(t, 1, 2, 4), (std::vector<int32_t>{3}));
  EXPECT_TRUE(LookupNgram(std::vector<int32_t>{1, 2, 3, 4}, 3, 2, 4).empty());
  EXPECT_TRUE(LookupNgram(std::vector<int32_t>{}, 3, 2, 4).empty());
}

TEST(SpecPolicy, ShrinksAndSwitchesOffWhenItDoesNotPay) {
  SpecConfig config;
  config.draft_max = 8;
  config.compute_bound_tokens = 64;
  const SpecPolicy policy(config);
  struct Priced {
    const SpecPolicy& p;
    double cost;
    int32_t Choose(const SpecState& s, int32_t cap) const { return p.Choose(s, cap, cost); }
  };
  const Priced cheap{policy, 0.05}, dear{policy, 0.6};
  SpecState high{0.95, 0}, low{0.3, 0};
  EXPECT_GE(cheap.Choose(high, 64), 6);
  EXPECT_EQ(dear.Choose(low, 64), 0);   // a 0.6-cost draft right 30% of the time loses
  EXPECT_EQ(cheap.Choose(high, 0), 0);  // no room: the step is compute-bound already
  EXPECT_LT(dear.Choose(high, 64), cheap.Choose(high, 64));
  config.draft_min = 2;
  EXPECT_EQ(SpecPolicy(config).Choose(low, 64, 0.6), 2);  // never below --draft-min
  // At depth the draft's and the verification's KV reads count: a whole-context draft right
  // 87% of the time pays at the start of a context and not at 16K (llama-1b F16: 53% of the
  // bytes plus the KV, against a KV share of 20% per verified position).
  config.draft_min = 0;
  const SpecPolicy deep(config);
  const SpecState s87{0.87, 0};
  EXPECT_GT(deep.Choose(s87, 64, 0.53, 0.0), 0);
  EXPECT_EQ(deep.Choose(s87, 64, 0.60, 0.20), 0);
  // Switched off, it probes with one draft after probe_after idle steps, ever more rarely while
  // the probes fail.
  SpecState idle{0.1, 32};
  EXPECT_EQ(dear.Choose(idle, 64), 1);
  SpecPolicy::Record(&idle, 1, 0);
  EXPECT_EQ(idle.probe_after, 64);
  idle.idle_steps = 40;
  EXPECT_EQ(dear.Choose(idle, 64), 0);
  SpecPolicy::Record(&idle, 1, 1);
  EXPECT_EQ(idle.probe_after, 32);
  SpecState s{0.8, 0};
  for (int i = 0; i < 20; ++i) SpecPolicy::Record(&s, 4, 0);
  EXPECT_LT(s.acceptance, 0.05);
}

}  // namespace
}  // namespace kvs
