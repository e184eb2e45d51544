// Token eviction in the engine with the real stories models (issue #19): a budget that never
// binds changes no token (batched and alone), every policy evicts and finishes within its budget
// with the pool whole at the end, and prefix-cache hits, quantized K/V, preemption and n > 1 all
// hold the cache's invariants every step (eviction_engine_test.cc has the exact, model-free
// cases).
#include <gtest/gtest.h>

#include <algorithm>
#include <climits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_builder.h"
#include "testing/int_lists.h"
#include "testing/test_models.h"

namespace kvs {
namespace {

using testing::Concat;
using testing::Range;

std::shared_ptr<const Model> Load(const std::string& name) {
  return testing::LoadTestModel(name);
}

// Prompts of about 100 tokens (6 of them), each different from its second token on.
std::vector<std::vector<int32_t>> LongPrompts(const Model& model, int32_t n = 6) {
  const int32_t vocab = model.config().n_vocab - 3;
  const int32_t lengths[] = {96, 100, 104, 97, 110, 90, 101, 99};
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t p = 0; p < n; ++p) {
    std::vector<int32_t> prompt = {1};
    for (int32_t i = 1; i < lengths[p % 8]; ++i) {
      prompt.push_back(3 + (p * 97 + i * 31 + i * i * 7) % vocab);
    }
    prompts.push_back(prompt);
  }
  return prompts;
}

struct Outcome {
  std::vector<std::vector<int32_t>> tokens;                      // [request][token] of choice 0
  std::vector<FinishReason> finish;                              // of choice 0
  std::vector<std::map<int32_t, std::vector<int32_t>>> choices;  // [request][choice][token]
  std::vector<std::map<int32_t, FinishReason>> choice_finish;
  std::vector<int32_t> cached;  // cached_tokens of each request's first event
  EngineStepStats totals;       // the last step's totals
  int32_t preemptions = 0;
  int32_t steps = 0;
  // The most slots any decoding sequence held past max(budget, frozen + sink + window) + a block
  // (INT_MIN: none had a budget).
  int32_t worst_excess = INT_MIN;
};

// An engine over a real model, stepped with checks: after every step each evicting sequence's
// table holds exactly its slots, its slot positions ascend to its last position, and a sequence
// past its prefill holds no more than its budget (or the frozen prefix and the guards) and a
// block.
class Harness {
 public:
  Harness(const Model& model, const EngineConfig& cfg, KvTypes types = {})
      : pool_(2), builder_(model, nullptr, pool_, KvFormatWithTypes(types)) {
    auto local = builder_.Local(cfg);
    EXPECT_TRUE(local.ok()) << local.error();
    if (local.ok()) local_ = std::move(*local);
    if (local_.engine) free_at_start_ = local_.engine->kv().num_free_blocks();
  }
  bool ok() const { return local_.engine != nullptr; }
  Engine& engine() { return *local_.engine; }
  int32_t free_at_start() const { return free_at_start_; }

  size_t Submit(const std::vector<int32_t>& prompt, const RequestOptions& o) {
    const size_t i = out_.tokens.size();
    out_.tokens.emplace_back();
    out_.finish.push_back(FinishReason::kNone);
    out_.cached.push_back(-1);
    out_.choices.emplace_back();
    out_.choice_finish.emplace_back();
    auto id = engine().Submit(prompt, o, [this, i](const TokenEvent& ev) {
      if (ev.token >= 0) out_.choices[i][ev.choice].push_back(ev.token);
      if (ev.finished) out_.choice_finish[i][ev.choice] = ev.reason;
      if (ev.choice != 0) return;
      if (ev.token >= 0) out_.tokens[i].push_back(ev.token);
      if (ev.finished) out_.finish[i] = ev.reason;
      if (out_.cached[i] < 0) out_.cached[i] = ev.cached_tokens;
    });
    EXPECT_TRUE(id.ok()) << id.error();
    return i;
  }

  void Step() {
    EngineStepStats st;
    ASSERT_TRUE(engine().Step(&st).ok());
    ++out_.steps;
    out_.preemptions += st.n_preempted;
    if (st.n_tokens > 0) out_.totals = st;
    const Engine& e = engine();
    const EvictionConfig& ev = e.config().eviction;
    for (const Sequence* s : e.scheduler().running()) {
      const BlockTable& t = e.kv().Table(s->id);
      ASSERT_EQ(t.num_tokens, s->n_slots());
      if (s->n_evicted > 0) {
        ASSERT_EQ(static_cast<int32_t>(s->slot_positions.size()), s->n_slots());
        ASSERT_TRUE(std::is_sorted(s->slot_positions.begin(), s->slot_positions.end()));
        ASSERT_EQ(s->slot_positions.back(), s->n_computed - 1);
        ASSERT_TRUE(t.compacted);
      }
      if (!s->kv_budget.active() || s->in_prefill() || s->n_output() == 0) continue;
      const int32_t frozen = e.kv().SharedPrefixSlots(s->id);
      const int64_t bound = std::max(int64_t{s->kv_budget.For(s->n_computed, ev.guard)},
                                     int64_t{frozen} + ev.guard.sink + ev.guard.window) +
                            e.kv().block_size();
      out_.worst_excess = static_cast<int32_t>(std::max<int64_t>(
          out_.worst_excess, std::max<int64_t>(int64_t{t.num_tokens} - bound, INT_MIN)));
    }
  }
  void RunToEnd(int max_steps = 5000) {
    for (int i = 0; i < max_steps && engine().HasWork(); ++i) {
      Step();
      if (::testing::Test::HasFatalFailure()) return;
    }
    ASSERT_FALSE(engine().HasWork()) << "still running after " << max_steps << " steps";
  }
  const Outcome& outcome() const { return out_; }

 private:
  ThreadPool pool_;
  EngineBuilder builder_;
  LocalEngine local_;
  int32_t free_at_start_ = 0;
  Outcome out_;
};

EngineConfig ModelConfig(const std::string& policy = "keydiff") {
  EngineConfig cfg;
  cfg.n_ctx = 512;
  cfg.max_seqs = 8;
  cfg.max_batch_tokens = 512;
  cfg.block_size = 16;
  cfg.n_blocks = 200;
  cfg.watermark_blocks = 0;
  cfg.verify_each_step = true;
  cfg.eviction.policy = policy;
  return cfg;
}

RequestOptions GreedyWith(int32_t max_tokens, KvBudget budget = {}) {
  RequestOptions o;
  o.sampling.temperature = 0;
  o.max_tokens = max_tokens;
  o.kv_budget = budget;
  return o;
}

// Serves prompts (all at once, up to max_seqs together) and runs them to the end.
Outcome Serve(const Model& model, const EngineConfig& cfg,
              const std::vector<std::vector<int32_t>>& prompts, const RequestOptions& o,
              KvTypes types = {}) {
  Harness h(model, cfg, types);
  if (!h.ok()) return {};
  for (const auto& p : prompts) h.Submit(p, o);
  h.RunToEnd();
  EXPECT_EQ(h.engine().kv().num_free_blocks(), h.free_at_start()) << "blocks leaked";
  EXPECT_EQ(h.engine().kv().num_sequences(), 0);
  return h.outcome();
}

const char* const kModels[] = {"stories260K.gguf", "stories-hd64-3M.gguf"};

class EvictionModelTest : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    model_ = Load(GetParam());
    if (!model_) GTEST_SKIP() << GetParam() << " not found under " << testing::TestModelsDir();
  }
  std::shared_ptr<const Model> model_;
};

// 1. A budget at least the final length never evicts, and changes no token: 6 sequences
// batched and 1 alone, budgets from the request (absolute and 100%) and from the engine, with
// policies that read keys and that observe attention (the runner then adds up attention mass).
TEST_P(EvictionModelTest, BudgetThatNeverBindsChangesNoToken) {
  const auto all = LongPrompts(*model_);
  for (const int32_t n : {6, 1}) {
    SCOPED_TRACE(std::to_string(n) + " sequences");
    const std::vector<std::vector<int32_t>> prompts(all.begin(), all.begin() + n);
    const Outcome plain = Serve(*model_, ModelConfig(), prompts, GreedyWith(40));
    ASSERT_EQ(plain.tokens.size(), prompts.size());
    struct Case {
      const char* policy;
      KvBudget request, engine;
    };
    for (const Case& c : {Case{"keydiff", {150, false}, {}}, Case{"h2o", {100, true}, {}},
                          Case{"snapkv", {}, {150, false}}}) {
      SCOPED_TRACE(std::string(c.policy) + " " + c.request.ToString() + " " + c.engine.ToString());
      EngineConfig cfg = ModelConfig(c.policy);
      cfg.eviction.budget = c.engine;
      const Outcome o = Serve(*model_, cfg, prompts, GreedyWith(40, c.request));
      EXPECT_EQ(o.tokens, plain.tokens);
      EXPECT_EQ(o.totals.evicted_tokens, 0);
      EXPECT_LE(o.worst_excess, 0);
      EXPECT_GT(o.worst_excess, INT_MIN) << "no sequence had a budget";
    }
  }
}

// 1b. The largest budget a flag or request may give (2147483647 positions) never evicts and
// changes no token; decode's "a block past the budget" is not an int32 overflow (UBSan).
TEST_P(EvictionModelTest, Int32MaxBudgetNeverEvicts) {
  const auto all = LongPrompts(*model_);
  const std::vector<std::vector<int32_t>> prompts(all.begin(), all.begin() + 2);
  const Outcome plain = Serve(*model_, ModelConfig(), prompts, GreedyWith(40));
  for (const std::string policy : {"streaming", "keydiff"}) {
    SCOPED_TRACE(policy);
    EngineConfig cfg = ModelConfig(policy);
    cfg.eviction.budget = KvBudget{INT32_MAX, false};
    const Outcome o = Serve(*model_, cfg, prompts, GreedyWith(40));
    EXPECT_EQ(o.tokens, plain.tokens);
    EXPECT_EQ(o.totals.evicted_tokens, 0);
    EXPECT_EQ(o.totals.compactions, 0);
  }
}

// 2. Every policy evicts: each request finishes, holds no more than its budget and a block,
// evictions free whole blocks, and the pool is whole at the end.
TEST_P(EvictionModelTest, EveryPolicyEvictsWithinItsBudget) {
  const auto prompts = LongPrompts(*model_);
  for (const std::string policy : {"streaming", "keydiff", "h2o", "snapkv", "tri"}) {
    for (const KvBudget budget : {KvBudget{48, false}, KvBudget{25, true}}) {
      SCOPED_TRACE(policy + ", budget " + budget.ToString());
      const Outcome o = Serve(*model_, ModelConfig(policy), prompts, GreedyWith(150, budget));
      ASSERT_EQ(o.finish.size(), prompts.size());
      for (size_t i = 0; i < prompts.size(); ++i) {
        EXPECT_EQ(o.finish[i], FinishReason::kLength) << "request " << i;
        EXPECT_EQ(o.tokens[i].size(), 150u) << "request " << i;
      }
      EXPECT_GT(o.totals.evicted_tokens, 0);
      EXPECT_GT(o.totals.blocks_freed_by_compaction, 0);
      EXPECT_GT(o.totals.compactions, 0);
      EXPECT_LE(o.worst_excess, 0) << "a sequence held more than its budget and a block";
      EXPECT_GT(o.worst_excess, INT_MIN);
    }
  }
}

// 4. Prefix cache. A request that never evicts holds a long prompt; a second one with the same
// prompt and a tail gets a hit and evicts around the shared (frozen) blocks without touching
// them: the first one's output is that of a run without eviction.
TEST_P(EvictionModelTest, PrefixHitsAreFrozenAndNeverRewritten) {
  const auto prompts = LongPrompts(*model_, 2);
  const std::vector<int32_t>& shared = prompts[0];
  const std::vector<int32_t> tailed = Concat(shared, Range(40, 60));
  const Outcome plain = Serve(*model_, ModelConfig(), {shared}, GreedyWith(120));

  for (const std::string policy : {"streaming", "keydiff"}) {
    SCOPED_TRACE(policy);
    Harness h(*model_, ModelConfig(policy));
    ASSERT_TRUE(h.ok());
    const size_t a = h.Submit(shared, GreedyWith(120, KvBudget{400, false}));
    h.Step();
    const size_t b = h.Submit(tailed, GreedyWith(100, KvBudget{48, false}));
    h.RunToEnd();
    const Outcome& o = h.outcome();
    EXPECT_EQ(o.cached[b], 96) << "the second request's hit: the first 6 blocks";
    EXPECT_EQ(o.tokens[a], plain.tokens[0]);
    EXPECT_EQ(o.finish[a], FinishReason::kLength);
    EXPECT_EQ(o.finish[b], FinishReason::kLength);
    EXPECT_GT(o.totals.evicted_tokens, 0);
    EXPECT_LE(o.worst_excess, 0);
    EXPECT_EQ(h.engine().kv().num_free_blocks(), h.free_at_start());
  }
}

// 4. Both requests evict: the second one's hit (whatever the first left uncompacted) is frozen
// for both; then a request whose prompt is the first one's prompt and output must answer as a
// fresh engine does: no compacted block is ever found under the hashes of the tokens it held.
TEST_P(EvictionModelTest, CompactedBlocksNeverServeAPrefixHit) {
  const auto prompts = LongPrompts(*model_, 1);
  const std::vector<int32_t>& prompt = prompts[0];
  for (const std::string policy : {"streaming", "keydiff", "h2o"}) {
    SCOPED_TRACE(policy);
    EngineConfig cfg = ModelConfig(policy);
    cfg.eviction.guard = {16, 32};  // a whole block of sinks: block 0 is never rewritten
    Harness h(*model_, cfg);
    ASSERT_TRUE(h.ok());
    const size_t a = h.Submit(prompt, GreedyWith(100, KvBudget{64, false}));
    h.Step();
    const size_t b = h.Submit(prompt, GreedyWith(100, KvBudget{64, false}));
    h.RunToEnd();
    const Outcome& o = h.outcome();
    EXPECT_GE(o.cached[b], 16);
    EXPECT_EQ(o.tokens[a], o.tokens[b]) << "same prompt, same budget: same output";
    EXPECT_EQ(o.finish[a], FinishReason::kLength);
    EXPECT_EQ(o.finish[b], FinishReason::kLength);
    EXPECT_GT(o.totals.evicted_tokens, 0);
    EXPECT_LE(o.worst_excess, 0);
    EXPECT_EQ(h.engine().kv().num_free_blocks(), h.free_at_start());

    const std::vector<int32_t> longer = Concat(prompt, o.tokens[a]);
    const size_t d = h.Submit(longer, GreedyWith(30));
    h.RunToEnd();
    EXPECT_LT(h.outcome().cached[d], static_cast<int32_t>(prompt.size()))
        << "a compacted block served a hit";
    const Outcome fresh = Serve(*model_, cfg, {longer}, GreedyWith(30));
    EXPECT_EQ(h.outcome().tokens[d], fresh.tokens[0]);
  }
}

// 5. Quantized K/V: a budget that never binds changes no token of the same-type run, and an
// evicting one (keys read back from the quantized cache) finishes with the cache whole.
TEST_P(EvictionModelTest, QuantizedKv) {
  const auto prompts = LongPrompts(*model_, 4);
  std::vector<KvTypes> types = {{KvType::kQ8_0, KvType::kQ8_0},
                                {KvType::kQ4_0, KvType::kQ4_0},
                                {KvType::kQ8_0, KvType::kQ4_0}};
  if (model_->config().head_dim_k < 32) types = {{KvType::kInt8, KvType::kInt8}};
  for (const KvTypes& t : types) {
    SCOPED_TRACE(std::string(KvTypeName(t.k)) + "/" + std::string(KvTypeName(t.v)));
    const Outcome plain = Serve(*model_, ModelConfig(), prompts, GreedyWith(60), t);
    const Outcome loose = Serve(*model_, ModelConfig(), prompts, GreedyWith(60, {200, false}), t);
    EXPECT_EQ(loose.tokens, plain.tokens);
    for (const std::string policy : {"keydiff", "tri"}) {
      SCOPED_TRACE(policy);
      const Outcome tight =
          Serve(*model_, ModelConfig(policy), prompts, GreedyWith(80, {48, false}), t);
      EXPECT_GT(tight.totals.evicted_tokens, 0);
      EXPECT_LE(tight.worst_excess, 0);
      for (FinishReason r : tight.finish) EXPECT_EQ(r, FinishReason::kLength);
    }
  }
}

// 6. Preemption: a pool of 16 blocks and chunked prefills that grow beside decodes; victims
// recompute their prompt and output and evict again; everything finishes with the pool whole.
TEST_P(EvictionModelTest, PreemptionWithEviction) {
  const auto prompts = LongPrompts(*model_);
  for (const std::string policy : {"streaming", "h2o"}) {
    SCOPED_TRACE(policy);
    EngineConfig cfg = ModelConfig(policy);
    cfg.n_blocks = 17;          // 16 blocks of 16: 256 positions
    cfg.max_batch_tokens = 40;  // chunked prefills grow while others decode
    const Outcome o = Serve(*model_, cfg, prompts, GreedyWith(40, {48, false}));
    EXPECT_GT(o.preemptions, 0);
    EXPECT_GT(o.totals.evicted_tokens, 0);
    for (FinishReason r : o.finish) EXPECT_EQ(r, FinishReason::kLength);
    for (const auto& t : o.tokens) EXPECT_EQ(t.size(), 40u);
  }
}

// 7. n > 1: the prompt is evicted at the end of prefill, then forked; the choices share its
// blocks, and n = 3 greedy choices agree token for token.
TEST_P(EvictionModelTest, ForksAfterEndOfPrefillEviction) {
  const auto prompts = LongPrompts(*model_, 2);
  for (const std::string policy : {"keydiff", "snapkv"}) {
    SCOPED_TRACE(policy);
    Harness h(*model_, ModelConfig(policy));
    ASSERT_TRUE(h.ok());
    RequestOptions o = GreedyWith(80, {48, false});
    o.n = 3;
    h.Submit(prompts[0], o);
    h.Submit(prompts[1], o);
    h.Step();
    const Engine& e = h.engine();
    ASSERT_EQ(e.scheduler().running().size(), 6u);
    for (const Sequence* s : e.scheduler().running()) {
      EXPECT_EQ(s->n_slots(), 48);
      EXPECT_GT(s->n_evicted, 0);
      EXPECT_EQ(e.kv().SharedPrefixSlots(s->id), 48);
    }
    h.RunToEnd();
    EXPECT_EQ(e.kv().num_free_blocks(), h.free_at_start());
    EXPECT_GT(h.outcome().totals.evicted_tokens, 0);
    for (size_t r = 0; r < 2; ++r) {
      ASSERT_EQ(h.outcome().choices[r].size(), 3u);
      for (int32_t c = 0; c < 3; ++c) {
        EXPECT_EQ(h.outcome().choices[r].at(c).size(), 80u);
        EXPECT_EQ(h.outcome().choices[r].at(c), h.outcome().choices[r].at(0));
        EXPECT_EQ(h.outcome().choice_finish[r].at(c), FinishReason::kLength);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, EvictionModelTest, ::testing::ValuesIn(kModels),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string n = info.param;
                           n = n.substr(0, n.find(".gguf"));
                           for (char& c : n) {
                             if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace kvs
