// The engine on a real trained model (stories260K): a request gives the same greedy tokens
// alone and batched with others, also with chunked prefill and with preemption forced by a
// tiny KV memory; and the model-backed runner copies shared blocks correctly for n > 1.
#include <gtest/gtest.h>

#include <map>
#include <memory>

#include "engine/engine.h"
#include "engine/engine_builder.h"
#include "engine/key_offsets.h"
#include "testing/test_models.h"

namespace kvs {
namespace {

struct Outcome {
  std::vector<std::vector<int32_t>> tokens;  // [request][token]
  int32_t preemptions = 0;
  int32_t max_running = 0;
  int64_t prefix_hits = 0;
};

std::vector<std::vector<int32_t>> Prompts() {
  // Eight prompts of different lengths (BOS first), tokens spread over the 512-token vocab.
  std::vector<std::vector<int32_t>> prompts;
  const int32_t lengths[] = {1, 5, 17, 9, 33, 2, 24, 12};
  for (int32_t p = 0; p < 8; ++p) {
    std::vector<int32_t> prompt = {1};
    for (int32_t i = 1; i < lengths[p]; ++i) prompt.push_back(3 + (p * 97 + i * 31) % 500);
    prompts.push_back(prompt);
  }
  return prompts;
}

Outcome Serve(const Model& model, const std::vector<std::vector<int32_t>>& prompts,
              EngineConfig cfg, int32_t max_tokens, int32_t rounds = 1, KvTypes types = {}) {
  ThreadPool pool(2);
  cfg.verify_each_step = true;
  auto local = EngineBuilder(model, nullptr, pool, KvFormatWithTypes(types)).Local(cfg);
  EXPECT_TRUE(local.ok()) << local.error();
  if (!local.ok()) return {};
  Engine& engine = *local->engine;
  Outcome out;
  out.tokens.resize(prompts.size());
  for (int32_t round = 0; round < rounds; ++round) {
    if (round > 0) {  // later rounds resubmit the same prompts: the prefix cache may serve them
      for (auto& t : out.tokens) t.clear();
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      RequestOptions o;
      o.sampling.temperature = 0;
      o.max_tokens = max_tokens;
      auto id = engine.Submit(prompts[i], o, [&out, i](const TokenEvent& e) {
        if (e.token >= 0) out.tokens[i].push_back(e.token);
      });
      EXPECT_TRUE(id.ok()) << id.error();
    }
    for (int step = 0; step < 10000 && engine.HasWork(); ++step) {
      EngineStepStats stats;
      EXPECT_TRUE(engine.Step(&stats).ok());
      out.preemptions += stats.n_preempted;
      out.max_running = std::max(out.max_running, stats.n_running);
      if (stats.n_tokens > 0) out.prefix_hits = stats.prefix_hits;
    }
  }
  EXPECT_FALSE(engine.HasWork());
  EXPECT_EQ(engine.kv().num_free_blocks(), engine.kv().num_usable_blocks());
  return out;
}

EngineConfig Config(int32_t max_seqs, int32_t budget, int32_t n_blocks) {
  EngineConfig cfg;
  cfg.n_ctx = 256;
  cfg.max_seqs = max_seqs;
  cfg.max_batch_tokens = budget;
  cfg.n_blocks = n_blocks;
  cfg.watermark_blocks = 0;
  return cfg;
}

class BatchedEqualsAlone : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = testing::TestModelPath("stories260K.gguf");
    if (path.empty()) {
      GTEST_SKIP() << "test model stories260K.gguf not found under " << testing::TestModelsDir()
                   << " (set KVSERVE_TEST_MODELS)";
    }
    auto m = Model::Load(path);
    ASSERT_TRUE(m.ok()) << m.error();
    model_ = std::move(*m);
    for (const auto& p : Prompts()) {
      alone_.push_back(Serve(*model_, {p}, Config(1, 512, 64), kMaxTokens).tokens[0]);
      ASSERT_EQ(alone_.back().size(), static_cast<size_t>(kMaxTokens));
    }
  }
  static constexpr int32_t kMaxTokens = 40;
  std::unique_ptr<Model> model_;
  std::vector<std::vector<int32_t>> alone_;
};

TEST_F(BatchedEqualsAlone, AllEightTogether) {
  Outcome together = Serve(*model_, Prompts(), Config(8, 512, 64), kMaxTokens);
  EXPECT_EQ(together.max_running, 8);
  EXPECT_EQ(together.tokens, alone_);
}

TEST_F(BatchedEqualsAlone, WithChunkedPrefill) {
  // A budget of 7 tokens a step splits every prompt longer than that into chunks, and decodes
  // of the running ones share each step with another's prefill chunk.
  Outcome chunked = Serve(*model_, Prompts(), Config(8, 7, 64), kMaxTokens);
  EXPECT_EQ(chunked.tokens, alone_);
}

TEST_F(BatchedEqualsAlone, WithPreemptionFromATinyKvMemory) {
  // 12 usable blocks of 16 positions for eight sequences of up to 73 positions (5 blocks).
  Outcome tight = Serve(*model_, Prompts(), Config(8, 64, 13), kMaxTokens);
  EXPECT_GT(tight.preemptions, 0);
  EXPECT_EQ(tight.tokens, alone_);
}

TEST_F(BatchedEqualsAlone, SameOutputsWithAndWithoutThePrefixCache) {
  // Eight prompts sharing a 37-token head (two full blocks), then different tails, served
  // twice: the second round hits the cache for every prompt, also under preemption.
  std::vector<std::vector<int32_t>> prompts = Prompts();
  std::vector<int32_t> head = {1};
  for (int32_t i = 1; i < 37; ++i) head.push_back(3 + (i * 53) % 500);
  for (auto& p : prompts) p.insert(p.begin() + 1, head.begin() + 1, head.end());
  EngineConfig off = Config(8, 64, 64);
  off.prefix_cache = false;
  const Outcome plain = Serve(*model_, prompts, off, kMaxTokens);
  EXPECT_EQ(plain.prefix_hits, 0);
  for (int32_t n_blocks : {64, 20}) {
    const Outcome cached = Serve(*model_, prompts, Config(8, 64, n_blocks), kMaxTokens, 2);
    EXPECT_EQ(cached.tokens, plain.tokens) << n_blocks << " blocks";
    EXPECT_GE(cached.prefix_hits, 8 * 32) << n_blocks << " blocks";
  }
  // Alone, with the cache warm from the other prompts.
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Outcome alone = Serve(*model_, {prompts[0], prompts[i]}, Config(1, 512, 64), kMaxTokens);
    EXPECT_EQ(alone.tokens[1], plain.tokens[i]) << i;
  }
}

TEST_F(BatchedEqualsAlone, WithLargerPoolBlocks) {
  EngineConfig cfg = Config(8, 512, 32);
  cfg.block_size = 32;  // two kernel blocks per pool block
  Outcome big = Serve(*model_, Prompts(), cfg, kMaxTokens);
  EXPECT_EQ(big.tokens, alone_);
}

TEST_F(BatchedEqualsAlone, ForkedChoicesMatchTheirPromptAlone) {
  // n = 3 greedy choices share the prompt's blocks, copy the partial one on their first write,
  // and must each produce what the prompt produces alone.
  ThreadPool pool(2);
  EngineConfig cfg = Config(4, 512, 64);
  cfg.verify_each_step = true;
  auto local = EngineBuilder(*model_, nullptr, pool).Local(cfg);
  ASSERT_TRUE(local.ok()) << local.error();
  Engine& engine = *local->engine;
  std::map<int32_t, std::vector<int32_t>> choices;
  RequestOptions o;
  o.sampling.temperature = 0;
  o.max_tokens = kMaxTokens;
  o.n = 3;
  ASSERT_TRUE(engine
                  .Submit(Prompts()[2], o,
                          [&](const TokenEvent& e) {
                            if (e.token >= 0) choices[e.choice].push_back(e.token);
                          })
                  .ok());
  while (engine.HasWork()) ASSERT_TRUE(engine.Step().ok());
  ASSERT_EQ(choices.size(), 3u);
  for (const auto& [choice, tokens] : choices) EXPECT_EQ(tokens, alone_[2]) << choice;
}

// Quantized K/V (3-bit keys, whose codes of neighbouring positions share bytes, and 4-bit
// values): a request still gives the same tokens alone, batched, chunked, preempted and served
// from the prefix cache, since every position's codes depend only on its own K/V.
TEST_F(BatchedEqualsAlone, QuantizedKvIsDeterministicAcrossSchedules) {
  const KvTypes types{KvType::kTurbo3, KvType::kQ4_0};
  std::vector<std::vector<int32_t>> quantized_alone;
  for (const auto& p : Prompts()) {
    quantized_alone.push_back(
        Serve(*model_, {p}, Config(1, 512, 64), kMaxTokens, 1, types).tokens[0]);
  }
  EXPECT_NE(quantized_alone, alone_) << "3-bit keys should change some greedy tokens";
  EXPECT_EQ(Serve(*model_, Prompts(), Config(8, 512, 64), kMaxTokens, 1, types).tokens,
            quantized_alone);
  EXPECT_EQ(Serve(*model_, Prompts(), Config(8, 7, 64), kMaxTokens, 1, types).tokens,
            quantized_alone);
  const Outcome tight = Serve(*model_, Prompts(), Config(8, 64, 13), kMaxTokens, 1, types);
  EXPECT_GT(tight.preemptions, 0);
  EXPECT_EQ(tight.tokens, quantized_alone);
  const Outcome cached = Serve(*model_, Prompts(), Config(8, 64, 64), kMaxTokens, 2, types);
  EXPECT_GT(cached.prefix_hits, 0);
  EXPECT_EQ(cached.tokens, quantized_alone);
}

}  // namespace
}  // namespace kvs
