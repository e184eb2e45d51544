// The draft-model drafter on real models: stories260K drafting for stories-hd64-3M (the same
// 512-token vocabulary). Its greedy drafts are stories260K's own greedy continuation, also after
// the engine's rollbacks (simulated here: a prefix of the drafts accepted, then a correction),
// alone or batched; sampled drafts carry their distributions; the pool is freed by Release and
// a full pool gives fewer drafts; and a pair of models with other vocabularies is refused.
#include "engine/spec/draft_model_drafter.h"

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/single_sequence.h"
#include "testing/test_models.h"
#include "testing/tiny_model.h"

namespace kvs {
namespace {

constexpr int32_t kCtx = 256;

SamplingParams Greedy() {
  SamplingParams p;
  p.temperature = 0;
  return p;
}

// A running sequence as the engine leaves it before drafting: every committed token but the
// last computed.
std::unique_ptr<Sequence> MakeSequence(int64_t id, std::vector<int32_t> prompt,
                                       const SamplingParams& params, int32_t n_vocab) {
  auto seq = std::make_unique<Sequence>();
  seq->id = SeqId{id};
  seq->state = SeqState::kRunning;
  seq->tokens = std::move(prompt);
  seq->n_prompt = static_cast<int32_t>(seq->tokens.size());
  seq->n_computed = seq->n_prompt - 1;
  seq->sampling.params = params;
  return seq;
}

// What the engine does after verifying: keeps n_accepted drafts, appends the token after them.
void Commit(Sequence& seq, const Draft& d, int32_t n_accepted, int32_t next) {
  seq.tokens.insert(seq.tokens.end(), d.tokens.begin(), d.tokens.begin() + n_accepted);
  seq.tokens.push_back(next);
  seq.n_computed = seq.n_committed() - 1;
}

// A prompt of n tokens, BOS first, spread over the vocabulary.
std::vector<int32_t> Prompt(int32_t n, int32_t salt) {
  std::vector<int32_t> p = {1};
  for (int32_t i = 1; i < n; ++i) p.push_back(3 + (salt * 97 + i * 31) % 500);
  return p;
}

class DraftModelDrafterTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string d = testing::TestModelPath("stories260K.gguf");
    const std::string t = testing::TestModelPath("stories-hd64-3M.gguf");
    if (d.empty() || t.empty()) return;
    auto draft = Model::Load(d);
    auto target = Model::Load(t);
    ASSERT_TRUE(draft.ok()) << draft.error();
    ASSERT_TRUE(target.ok()) << target.error();
    draft_ = std::move(draft).value().release();
    target_ = std::move(target).value().release();
  }
  static void TearDownTestSuite() {
    delete draft_;
    delete target_;
    draft_ = target_ = nullptr;
  }
  void SetUp() override {
    if (draft_ == nullptr) GTEST_SKIP() << "stories260K / stories-hd64-3M not found";
  }

  std::unique_ptr<DraftModelDrafter> Make(const DraftModelOptions& options = {},
                                          int32_t max_seqs = 4) {
    auto drafter = MakeDraftModelDrafter(*target_, *draft_, pool_, kCtx, max_seqs, options);
    EXPECT_TRUE(drafter.ok()) << drafter.error();
    return drafter.ok() ? std::move(drafter).value() : nullptr;
  }

  // stories260K's greedy continuation of history, k tokens, over the drafter's KV format (f16).
  std::vector<int32_t> Reference(const std::vector<int32_t>& history, int32_t k) {
    KvFormatOptions kv = DraftModelOptions().kv;
    kv.n_ctx = kCtx;
    auto format = MakeKvFormat(*draft_, nullptr, pool_, kv);
    EXPECT_TRUE(format.ok()) << format.error();
    SingleSequence single(*draft_, pool_, kCtx, *format);
    const int32_t n_vocab = draft_->config().n_vocab;
    std::vector<float> logits(n_vocab);
    const int32_t n = static_cast<int32_t>(history.size());
    EXPECT_TRUE(single.Run(history.data(), n, 0, 1, logits.data()).ok());
    std::vector<int32_t> out;
    for (int32_t j = 0; j < k; ++j) {
      out.push_back(ArgMax(logits.data(), n_vocab));
      if (j + 1 < k) {
        EXPECT_TRUE(single.Run(&out.back(), 1, n + j, 1, logits.data()).ok());
      }
    }
    return out;
  }

  std::vector<int32_t> Committed(const Sequence& seq) {
    return {seq.tokens.begin(), seq.tokens.begin() + seq.n_committed()};
  }

  static Model* draft_;
  static Model* target_;
  ThreadPool pool_{2};
  KvCacheManager target_kv_{16, 16};  // the drafter never reads the target's KV
};
Model* DraftModelDrafterTest::draft_ = nullptr;
Model* DraftModelDrafterTest::target_ = nullptr;

// Rounds of drafting with the engine's rollbacks in between: 2 of 4 accepted and a correction,
// none accepted, all accepted and a bonus, 1 accepted. Each time the drafts are the greedy
// continuation of the new history: the drafter rolled its KV back to the shared prefix and
// computed the rest. Also with a prefill cut into chunks of 7 tokens.
TEST_F(DraftModelDrafterTest, GreedyDraftsFollowTheHistoryThroughRollbacks) {
  for (int32_t chunk : {512, 7}) {
    SCOPED_TRACE(chunk);
    DraftModelOptions options;
    options.max_batch_tokens = chunk;
    auto drafter = Make(options);
    ASSERT_NE(drafter, nullptr);
    EXPECT_EQ(drafter->name(), "draft");
    EXPECT_GT(drafter->relative_cost(), 0.0);
    EXPECT_LT(drafter->relative_cost(), 0.2);  // 260K parameters against 3M
    auto seq = MakeSequence(7, Prompt(20, 1), Greedy(), 512);
    const int32_t k = 4;
    const int32_t accepted[] = {2, 0, 4, 1, 3};
    for (int32_t round = 0; round < 5; ++round) {
      SCOPED_TRACE(round);
      const DraftRequest request{seq.get(), k};
      Draft draft;
      ASSERT_TRUE(drafter->Propose({&request, 1}, target_kv_, {&draft, 1}).ok());
      ASSERT_EQ(draft.tokens, Reference(Committed(*seq), k));
      ASSERT_EQ(draft.probs.size(), draft.tokens.size());
      // The draft's KV holds the committed tokens and every draft but the last.
      EXPECT_EQ(drafter->kv().Table(seq->id).num_tokens, seq->n_committed() + k - 1);
      const int32_t n = accepted[round];
      const int32_t next = n < k ? (draft.tokens[n] + 1 + round) % 512 : 100 + round;
      Commit(*seq, draft, n, next);
    }
  }
}

// A history that differs inside what the draft computed (a sequence id reused, or a preempted
// sequence not released): the drafter keeps only the shared prefix and recomputes the rest.
TEST_F(DraftModelDrafterTest, RecomputesFromTheFirstDifference) {
  auto drafter = Make();
  ASSERT_NE(drafter, nullptr);
  auto seq = MakeSequence(7, Prompt(30, 11), Greedy(), 512);
  const DraftRequest request{seq.get(), 4};
  Draft draft;
  ASSERT_TRUE(drafter->Propose({&request, 1}, target_kv_, {&draft, 1}).ok());
  ASSERT_EQ(draft.tokens, Reference(Committed(*seq), 4));
  for (int32_t pos : {20, 3, 29}) {  // the last: the last committed token, never kept anyway
    SCOPED_TRACE(pos);
    seq->tokens[pos] = (seq->tokens[pos] + 5) % 512;
    ASSERT_TRUE(drafter->Propose({&request, 1}, target_kv_, {&draft, 1}).ok());
    EXPECT_EQ(draft.tokens, Reference(Committed(*seq), 4));
  }
  // Shorter than what the draft holds (a rollback of committed tokens).
  seq->tokens.resize(12);
  seq->n_computed = 11;
  ASSERT_TRUE(drafter->Propose({&request, 1}, target_kv_, {&draft, 1}).ok());
  EXPECT_EQ(draft.tokens, Reference(Committed(*seq), 4));
  EXPECT_EQ(drafter->kv().Table(seq->id).num_tokens, 12 + 4 - 1);
  EXPECT_TRUE(drafter->kv().VerifyIntegrity().ok());
}

// Sequences batched into one pass give the drafts each gives alone (different lengths, one new
// while the others are caught up, with rollbacks), sampled ones too: their own samplers draw the
// same tokens from the same distributions.
TEST_F(DraftModelDrafterTest, BatchedEqualsAlone) {
  auto together = Make();
  auto alone = Make();
  ASSERT_NE(together, nullptr);
  ASSERT_NE(alone, nullptr);
  std::vector<std::unique_ptr<Sequence>> seqs;
  seqs.push_back(MakeSequence(1, Prompt(9, 2), Greedy(), 512));
  SamplingParams sampled;  // the same seed alone and batched: the same draws from the same rows
  sampled.temperature = 1.f;
  seqs.push_back(MakeSequence(2, Prompt(33, 3), sampled, 512));
  seqs.push_back(MakeSequence(3, Prompt(3, 4), Greedy(), 512));
  for (int32_t round = 0; round < 4; ++round) {
    SCOPED_TRACE(round);
    // Sequence 3 joins in round 1; sequence 1 asks for fewer drafts.
    std::vector<DraftRequest> requests;
    std::vector<Sequence*> order;
    for (size_t i = 0; i < seqs.size(); ++i) {
      if (i == 2 && round == 0) continue;
      requests.push_back({seqs[i].get(), i == 0 ? 3 : 5});
      order.push_back(seqs[i].get());
    }
    std::vector<Draft> batched(requests.size());
    ASSERT_TRUE(together->Propose(requests, target_kv_, batched).ok());
    for (size_t i = 0; i < requests.size(); ++i) {
      Draft single;
      ASSERT_TRUE(alone->Propose({&requests[i], 1}, target_kv_, {&single, 1}).ok());
      EXPECT_EQ(batched[i].tokens, single.tokens) << "request " << i;
      ASSERT_EQ(batched[i].probs.size(), single.probs.size());
      for (size_t j = 0; j < single.probs.size(); ++j) {
        ASSERT_EQ(batched[i].probs[j].size(), single.probs[j].size());
        for (size_t t = 0; t < single.probs[j].size(); ++t) {
          EXPECT_EQ(batched[i].probs[j][t].id, single.probs[j][t].id);
          EXPECT_NEAR(batched[i].probs[j][t].p, single.probs[j][t].p, 1e-6);
        }
      }
      EXPECT_EQ(static_cast<int32_t>(batched[i].tokens.size()), requests[i].max_drafts);
      Commit(*order[i], batched[i], static_cast<int32_t>(i + round) % 3, 200 + round);
    }
  }
}

// Sampled drafts carry the distribution each was drawn from: it sums to 1, holds the token and
// at most top_k entries. Greedy drafts are point masses.
TEST_F(DraftModelDrafterTest, DraftsCarryTheirDistributions) {
  auto drafter = Make();
  ASSERT_NE(drafter, nullptr);
  SamplingParams sampled;
  sampled.temperature = 1.f;
  sampled.top_k = 40;
  sampled.top_p = 1.f;
  sampled.min_p = 0.f;
  auto a = MakeSequence(1, Prompt(12, 5), sampled, 512);
  auto b = MakeSequence(2, Prompt(12, 5), Greedy(), 512);
  const DraftRequest requests[] = {{a.get(), 6}, {b.get(), 6}};
  std::vector<Draft> drafts(2);
  ASSERT_TRUE(drafter->Propose(requests, target_kv_, drafts).ok());
  ASSERT_EQ(drafts[0].tokens.size(), 6u);
  ASSERT_EQ(drafts[0].probs.size(), 6u);
  for (size_t j = 0; j < 6; ++j) {
    const auto& q = drafts[0].probs[j];
    EXPECT_LE(q.size(), 40u);
    EXPECT_GT(q.size(), 1u);
    double sum = 0;
    bool holds = false;
    for (const TokenProb& t : q) {
      sum += t.p;
      holds |= t.id == drafts[0].tokens[j];
    }
    EXPECT_NEAR(sum, 1.0, 1e-4) << "draft " << j;
    EXPECT_TRUE(holds) << "draft " << j;
  }
  ASSERT_EQ(drafts[1].probs.size(), 6u);
  for (size_t j = 0; j < 6; ++j) {
    ASSERT_EQ(drafts[1].probs[j].size(), 1u);
    EXPECT_EQ(drafts[1].probs[j][0].id, drafts[1].tokens[j]);
    EXPECT_EQ(drafts[1].probs[j][0].p, 1.f);
  }
  // (The target's sampler lives in the runner (engine/step_sampler.h), out of the drafter's
  // reach: the drafter draws from a sampler of its own.)
}

// Release returns every block of the draft's pool and drops the sequence's state.
TEST_F(DraftModelDrafterTest, ReleaseFreesThePool) {
  auto drafter = Make();
  ASSERT_NE(drafter, nullptr);
  const int32_t full = drafter->kv().num_usable_blocks();
  EXPECT_EQ(full, 4 * kCtx / 16);  // max_seqs sequences of n_ctx positions
  EXPECT_EQ(drafter->kv().num_free_blocks(), full);
  auto a = MakeSequence(1, Prompt(40, 6), Greedy(), 512);
  auto b = MakeSequence(2, Prompt(5, 7), Greedy(), 512);
  const DraftRequest requests[] = {{a.get(), 4}, {b.get(), 4}};
  std::vector<Draft> drafts(2);
  ASSERT_TRUE(drafter->Propose(requests, target_kv_, drafts).ok());
  EXPECT_EQ(drafter->num_sequences(), 2);
  EXPECT_EQ(drafter->kv().num_free_blocks(), full - 3 - 1);  // 43 and 8 positions
  drafter->Release(a->id);
  drafter->Release(b->id);
  drafter->Release(SeqId{99});  // never seen: nothing to do
  EXPECT_EQ(drafter->num_sequences(), 0);
  EXPECT_EQ(drafter->kv().num_free_blocks(), full);
  EXPECT_TRUE(drafter->kv().VerifyIntegrity().ok());
}

// A pool too small for the drafts gives fewer drafts, not an error; one without room for the
// catch-up gives none, and the other sequences still draft.
TEST_F(DraftModelDrafterTest, FullPoolGivesFewerDrafts) {
  DraftModelOptions options;
  options.n_blocks = 1 + 1;  // one block of 16 positions
  auto drafter = Make(options);
  ASSERT_NE(drafter, nullptr);
  auto a = MakeSequence(1, Prompt(14, 8), Greedy(), 512);
  auto b = MakeSequence(2, Prompt(3, 9), Greedy(), 512);
  const DraftRequest requests[] = {{a.get(), 4}, {b.get(), 4}};
  std::vector<Draft> drafts(2);
  ASSERT_TRUE(drafter->Propose(requests, target_kv_, drafts).ok());
  // Positions 0..13 are the prompt, drafts 1 and 2 go in at 14 and 15, draft 3 has no slot.
  EXPECT_EQ(drafts[0].tokens, Reference(a->tokens, 3));
  EXPECT_EQ(drafts[0].probs.size(), 3u);
  EXPECT_TRUE(drafts[1].tokens.empty());
  EXPECT_TRUE(drafts[1].probs.empty());
  EXPECT_EQ(drafter->kv().num_free_blocks(), 0);
  // Once the first is released the second drafts in full.
  drafter->Release(a->id);
  ASSERT_TRUE(drafter->Propose({&requests[1], 1}, target_kv_, {&drafts[1], 1}).ok());
  EXPECT_EQ(drafts[1].tokens, Reference(b->tokens, 4));
  // A prompt longer than the pool: no drafts, no error.
  auto c = MakeSequence(3, Prompt(40, 10), Greedy(), 512);
  const DraftRequest long_request{c.get(), 4};
  Draft none;
  ASSERT_TRUE(drafter->Propose({&long_request, 1}, target_kv_, {&none, 1}).ok());
  EXPECT_TRUE(none.tokens.empty());
  EXPECT_TRUE(drafter->kv().VerifyIntegrity().ok());
}

TEST_F(DraftModelDrafterTest, PairingAcceptsTheSameVocabulary) {
  EXPECT_TRUE(CheckDraftPairing(*target_, *draft_).ok());
  EXPECT_TRUE(CheckDraftPairing(*draft_, *target_).ok());
}

TEST_F(DraftModelDrafterTest, PairingRefusesAnotherVocabularySize) {
  KVS_REQUIRE_MODEL(path, "random-weights/llama-2-tiny-random.gguf");
  auto other = Model::Load(path);
  ASSERT_TRUE(other.ok()) << other.error();
  const Status st = CheckDraftPairing(*target_, **other);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("vocabulary has 32000 tokens, the target's 512"), std::string::npos)
      << st.message();
  auto made = MakeDraftModelDrafter(*target_, **other, pool_, kCtx, 4);
  ASSERT_FALSE(made.ok());
  EXPECT_EQ(made.error(), st.message());
}

// Tiny models of one vocabulary size whose tokenizers differ.
std::unique_ptr<Model> TinyModel(const std::function<void(gguf::Writer&)>& edit) {
  testing::TinyModelSpec spec;
  gguf::Writer w = testing::MakeTinyModelWriter(spec);
  edit(w);
  auto file = gguf::File::FromBytes(w.Serialize());
  EXPECT_TRUE(file.ok()) << file.error();
  auto model = Model::FromFile(std::move(*file));
  EXPECT_TRUE(model.ok()) << model.error();
  return std::move(model).value();
}

TEST(DraftPairingTest, RefusesAnotherTokenizer) {
  auto base = TinyModel([](gguf::Writer&) {});
  EXPECT_TRUE(CheckDraftPairing(*base, *TinyModel([](gguf::Writer&) {})).ok());

  auto gpt2 = TinyModel(
      [](gguf::Writer& w) { w.Set("tokenizer.ggml.model", gguf::Value::String("gpt2")); });
  Status st = CheckDraftPairing(*base, *gpt2);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("tokenizer model is gpt2, the target's llama"), std::string::npos)
      << st.message();

  auto renamed = TinyModel([](gguf::Writer& w) {
    std::vector<std::string> tokens(testing::kTinyVocab);
    for (int32_t i = 0; i < testing::kTinyVocab; ++i) tokens[i] = StrFormat("tok%d", i);
    w.Set("tokenizer.ggml.tokens", gguf::Value::StringArray(tokens));
  });
  st = CheckDraftPairing(*base, *renamed);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("token 0 is \"tok0\" in the draft's vocabulary, \"<unk>\""),
            std::string::npos)
      << st.message();

  auto eos = TinyModel(
      [](gguf::Writer& w) { w.Set("tokenizer.ggml.eos_token_id", gguf::Value::Uint32(1)); });
  st = CheckDraftPairing(*base, *eos);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("eos_token_id is 1, the target's 2"), std::string::npos)
      << st.message();
}

}  // namespace
}  // namespace kvs
