// The runner's sampling (engine/step_sampler.h) seen from the engine: a sequence's draws depend
// on its own history and seed only, never on what else ran beside it, however the steps were
// batched, preempted, shared or forked.
#include <gtest/gtest.h>

#include <vector>

#include "engine/engine.h"
#include "engine/step_sampler.h"
#include "testing/fake_model.h"

namespace kvs::engine_sampling_test {
namespace {

using namespace testing;  // NOLINT(google-build-using-namespace)

EngineConfig Config(int32_t n_blocks, int32_t block_size, int32_t max_seqs) {
  EngineConfig c;
  c.n_ctx = 256;
  c.n_blocks = n_blocks;
  c.block_size = block_size;
  c.max_seqs = max_seqs;
  c.max_batch_tokens = 64;
  c.watermark_blocks = 0;
  c.verify_each_step = true;
  return c;
}

// Seeded sampling with every penalty gives each choice the same tokens whether its request runs
// alone or among others in a pool so small that sequences are preempted and recomputed, share
// cached prefixes and fork: the runner's token histories (the penalties') follow the engine's.
class RichRunner final : public StepRunner {
 public:
  int32_t n_vocab() const override { return kVocab; }
  Status CopyBlocks(std::span<const BlockCopy>) override { return Status::Ok(); }
  Status Execute(const StepBatch& step, StepOutput* out) override {
    mirror_.Apply(step);
    KVS_RETURN_IF_ERROR(sampler_.Apply(step));
    logits_.assign(static_cast<size_t>(step.n_logit_rows) * kVocab, 0.f);
    int32_t row = 0;
    for (const StepRun& r : step.runs) {
      for (int32_t i = 0; i < r.n_logits; ++i) {
        const size_t n = static_cast<size_t>(r.first_position + r.n_tokens - r.n_logits + i + 1);
        // Logits spread over the vocabulary, a function of the whole history before.
        uint32_t h = static_cast<uint32_t>(NextToken(mirror_.tokens(r.seq), n));
        float* out_row = logits_.data() + static_cast<size_t>(row++) * kVocab;
        for (int32_t v = 0; v < kVocab; ++v) {
          h = h * 1103515245u + 12345u;
          out_row[v] = static_cast<float>((h >> 16) % 1000) / 250.f;
        }
      }
    }
    return sampler_.Sample(step, logits_.data(), out);
  }

 private:
  RunnerMirror mirror_;
  StepSampler sampler_{kVocab};
  std::vector<float> logits_;
};

TEST(EngineSampling, PenalizedSamplingIsTheSameAloneAndUnderPreemptionPrefixHitsAndForks) {
  auto options = [](int32_t request) {
    RequestOptions o;
    o.max_tokens = 14;
    o.n = request == 1 ? 2 : 1;
    o.sampling.temperature = 0.9f;
    o.sampling.top_k = 0;
    o.sampling.top_p = 1.f;
    o.sampling.min_p = 0.f;
    o.sampling.repeat_penalty = 1.5f;
    o.sampling.frequency_penalty = 0.7f;
    o.sampling.presence_penalty = 0.4f;
    o.sampling.seed = 77 + request;
    o.logprobs = 1;
    return o;
  };
  // Three requests sharing a 8-token prefix (two blocks of 4).
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t r = 0; r < 3; ++r) {
    std::vector<int32_t> p = Prompt(8, 5);
    const std::vector<int32_t> tail = Prompt(3 + r, 10 + r);
    p.insert(p.end(), tail.begin(), tail.end());
    prompts.push_back(p);
  }
  std::vector<Collected> alone(3);
  for (int32_t r = 0; r < 3; ++r) {
    RichRunner runner;
    Engine e(Config(64, 4, 4), runner);
    Submit(e, prompts[r], options(r), &alone[r]);
    RunToEnd(e);
  }
  RichRunner runner;
  EngineConfig cfg = Config(13, 4, 4);  // 12 blocks of 4 for 4 sequences of up to 28
  cfg.watermark_blocks = 0;
  Engine e(cfg, runner);
  std::vector<Collected> together(3);
  for (int32_t r = 0; r < 3; ++r) Submit(e, prompts[r], options(r), &together[r]);
  EngineStepStats stats;
  int64_t preempted = 0;
  for (int i = 0; i < 2000 && e.HasWork(); ++i) {
    ASSERT_TRUE(e.Step(&stats).ok());
    preempted += stats.n_preempted;
  }
  ASSERT_FALSE(e.HasWork());
  EXPECT_GT(preempted, 0) << "the pool was not small enough to preempt";
  EXPECT_GT(stats.prefix_hits, 0) << "no prefix was shared";
  for (int32_t r = 0; r < 3; ++r) {
    EXPECT_EQ(together[r].tokens, alone[r].tokens) << "request " << r;
    EXPECT_EQ(alone[r].tokens[0].size(), 14u);
  }
  EXPECT_EQ(alone[1].tokens.size(), 2u);
  EXPECT_NE(alone[1].tokens[0], alone[1].tokens[1]) << "the choices drew alike: seeds not apart";
}

}  // namespace
}  // namespace kvs::engine_sampling_test
