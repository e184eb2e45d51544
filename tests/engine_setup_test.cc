// ResolveEngineOptions (src/api/engine_setup.h): the one place kvserve::EngineOptions are checked
// and turned into the engine's config. Exact messages for options that do not go together, and
// exact derived values.
#include "api/engine_setup.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "testing/tiny_model.h"

namespace kvs::engine_setup_test {
namespace {

class EngineSetupTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string path = testing::WriteTinyModel({}, "engine_setup_test.gguf");
    auto model = Model::Load(path, {});
    ASSERT_TRUE(model.ok()) << model.error();
    model_ = std::move(*model).release();
    auto tokenizer = Tokenizer::FromGguf(model_->file());
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.error();
    tokenizer_ = std::move(*tokenizer).release();
  }

  // The options' error, or "" when they resolve.
  static std::string ErrorOf(const kvserve::EngineOptions& o, const PoolShape& pool = {}) {
    auto setup = ResolveEngineOptions(o, *model_, tokenizer_, pool);
    return setup.ok() ? std::string() : setup.error();
  }

  static kvserve::EngineOptions Small() {
    kvserve::EngineOptions o;
    o.n_ctx = 256;
    o.n_parallel = 2;
    o.kv_memory_bytes = 1 << 20;
    return o;
  }

  static Model* model_;
  static Tokenizer* tokenizer_;
};

Model* EngineSetupTest::model_ = nullptr;
Tokenizer* EngineSetupTest::tokenizer_ = nullptr;

// The tiny model: 2 layers, 2 KV heads of 16: a 16-position f16 block is 2 x 2 x 2 x 16 x 16 x 2.
TEST_F(EngineSetupTest, PoolFromKvMemory) {
  auto setup = ResolveEngineOptions(Small(), *model_, tokenizer_);
  ASSERT_TRUE(setup.ok()) << setup.error();
  EXPECT_EQ(setup->geometry.BytesPerBlock(), 4096u);
  EXPECT_EQ(setup->config.n_blocks, 256);
  EXPECT_EQ(setup->config.watermark_blocks, -1);
  EXPECT_EQ(setup->options.kv_memory_bytes, 1 << 20);
  EXPECT_EQ(setup->config.n_ctx, 256);
  EXPECT_EQ(setup->config.max_seqs, 2);
  EXPECT_EQ(setup->config.max_batch_tokens, 512);
  EXPECT_EQ(setup->config.block_size, 16);
  EXPECT_TRUE(setup->config.prefix_caching());
  EXPECT_GT(setup->options.threads, 0);  // 0: resolved to the CPUs this process may use
  EXPECT_EQ(setup->kv.types.k, KvType::kF16);
  EXPECT_EQ(setup->kv.types.v, KvType::kF16);
  EXPECT_FALSE(setup->kv.transform_codec);
  EXPECT_EQ(setup->spec.type, SpecType::kNone);
  EXPECT_FALSE(setup->events.has_value());
  EXPECT_FALSE(setup->config.eviction.budget.active());
}

// Default KV memory: n_parallel full contexts (2 x 16 blocks), the null block and 2% on top, and
// one more: ceil(33 x 1.02) + 1 = 35 blocks.
TEST_F(EngineSetupTest, DefaultKvMemoryHoldsNParallelContexts) {
  kvserve::EngineOptions o = Small();
  o.kv_memory_bytes = 0;
  auto setup = ResolveEngineOptions(o, *model_, tokenizer_);
  ASSERT_TRUE(setup.ok()) << setup.error();
  EXPECT_EQ(setup->config.n_blocks, 35);
  EXPECT_EQ(setup->options.kv_memory_bytes, 35 * 4096);
}

// A model with sliding-window layers keeps a block table per kind of attention: the default
// pool holds n_parallel full contexts in every group. Window 24 with pattern 2 (layer 0 local,
// layer 1 global), -c 256, chunks of 32: 16 global blocks + min(16, ceil(56 / 16) + 2 = 6) local
// per sequence, so ceil((2 x 22 + 1) x 1.02) + 1 = 47 blocks.
TEST_F(EngineSetupTest, DefaultKvMemoryHoldsEveryKvGroupOfNParallelContexts) {
  gguf::Writer w = testing::MakeTinyModelWriter({});
  w.Set("llama.attention.sliding_window", gguf::Value::Uint32(24));
  w.Set("llama.attention.sliding_window_pattern", gguf::Value::Uint32(2));
  auto f = gguf::File::FromBytes(w.Serialize());
  ASSERT_TRUE(f.ok()) << f.error();
  auto sliding = Model::FromFile(std::move(*f));
  ASSERT_TRUE(sliding.ok()) << sliding.error();
  ASSERT_EQ((*sliding)->config().kv_groups.size(), 2u);
  kvserve::EngineOptions o = Small();
  o.kv_memory_bytes = 0;
  o.max_batch_tokens = 32;
  auto setup = ResolveEngineOptions(o, **sliding, tokenizer_);
  ASSERT_TRUE(setup.ok()) << setup.error();
  EXPECT_EQ(setup->config.n_blocks, 47);
}

TEST_F(EngineSetupTest, ExactPoolShape) {
  kvserve::EngineOptions o = Small();
  o.n_parallel = 1;
  auto setup = ResolveEngineOptions(o, *model_, tokenizer_, PoolShape{10, 0});
  ASSERT_TRUE(setup.ok()) << setup.error();
  EXPECT_EQ(setup->config.n_blocks, 10);
  EXPECT_EQ(setup->config.watermark_blocks, 0);
  EXPECT_EQ(setup->options.kv_memory_bytes, 10 * 4096);
  // An exact pool is still validated: the null block alone holds no sequence.
  EXPECT_EQ(ErrorOf(o, PoolShape{1, 0}), "the KV memory holds 0 blocks: too few for any sequence");
}

TEST_F(EngineSetupTest, TiersAndEventsNeedThePrefixCache) {
  kvserve::EngineOptions o = Small();
  o.prefix_cache = false;
  o.kv_disk = "/tmp/engine_setup_test_never_opened";
  EXPECT_EQ(ErrorOf(o),
            "--kv-disk keeps the prefix cache's blocks: it cannot go with --no-prefix-cache");
  o = Small();
  o.reserve_full_context = true;  // the contiguous baseline shares nothing either
  o.kv_redis = "redis://127.0.0.1:1";
  EXPECT_EQ(ErrorOf(o),
            "--kv-redis shares the prefix cache's blocks: it cannot go with --no-prefix-cache");
  o = Small();
  o.prefix_cache = false;
  o.kv_events = "tcp://127.0.0.1:1";
  EXPECT_EQ(ErrorOf(o),
            "--kv-events reports the prefix cache's blocks: it cannot go with --no-prefix-cache");
  o.kv_events.clear();
  o.kv_events_topic = "kv@pod@model";
  EXPECT_EQ(ErrorOf(o),
            "--kv-events-replay and --kv-events-topic are only used with --kv-events ENDPOINT");
  o.kv_events_topic.clear();
  o.kv_redis_password_file = "/dev/null";
  EXPECT_EQ(ErrorOf(o), "--kv-redis-password-file is only used with --kv-redis URL");
}

TEST_F(EngineSetupTest, TiersAndEventsResolve) {
  kvserve::EngineOptions o = Small();
  o.kv_disk = "/tmp/engine_setup_test_never_opened";
  o.kv_disk_codec = "tc:4";
  o.kv_events = "tcp://127.0.0.1:5557";
  o.kv_events_topic = "kv@pod@model";
  auto setup = ResolveEngineOptions(o, *model_, tokenizer_);
  ASSERT_TRUE(setup.ok()) << setup.error();
  EXPECT_EQ(setup->config.kv_disk.dir, o.kv_disk);
  EXPECT_EQ(setup->config.kv_disk.codec, BlockCodec::kTransform);
  EXPECT_TRUE(setup->kv.transform_codec);
  ASSERT_TRUE(setup->events.has_value());
  EXPECT_EQ(setup->events->endpoint, "tcp://127.0.0.1:5557");
  EXPECT_EQ(setup->events->topic, "kv@pod@model");
  EXPECT_EQ(setup->config.kv_event_sink, nullptr);  // the caller opens the publisher
}

TEST_F(EngineSetupTest, KvBudget) {
  kvserve::EngineOptions o = Small();
  o.kv_budget = "12.5%";
  auto setup = ResolveEngineOptions(o, *model_, tokenizer_);
  ASSERT_TRUE(setup.ok()) << setup.error();
  EXPECT_TRUE(setup->config.eviction.budget.percent);
  EXPECT_EQ(setup->config.eviction.budget.value, 12);
  EXPECT_EQ(setup->config.eviction.budget.tenths, 5);
  EXPECT_EQ(setup->config.eviction.guard.sink, 4);
  EXPECT_EQ(setup->config.eviction.guard.window, 32);

  o.kv_budget = "abc";
  EXPECT_EQ(ErrorOf(o),
            "--kv-budget 'abc': expected a number of positions (e.g. 1024) or a percentage of "
            "the sequence's length (e.g. 25%)");
  o.kv_budget = "10";
  EXPECT_EQ(ErrorOf(o),
            "--kv-budget 10: must be at least --kv-sink + --kv-window (4 + 32), which are never "
            "evicted");
  o.kv_budget = "25%";
  o.spec_type = "ngram";
  EXPECT_EQ(ErrorOf(o),
            "--kv-budget and --spec-type cannot be combined yet: drafters read the KV by "
            "position, and a sequence that evicted holds fewer slots than positions");

  // A request's budget: the same parse, named as the request field.
  auto request = ParseRequestKvBudget("8", {4, 32});
  ASSERT_FALSE(request.ok());
  EXPECT_EQ(request.error(),
            "kv_budget 8: must be at least --kv-sink + --kv-window (4 + 32), which are never "
            "evicted");
  auto off = ParseRequestKvBudget("0", {4, 32});
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->active());
}

TEST_F(EngineSetupTest, Speculation) {
  kvserve::EngineOptions o = Small();
  o.spec_type = "draft";
  EXPECT_EQ(ErrorOf(o),
            "--spec-type draft needs a draft model: -md/--model-draft FILE (a GGUF with the same "
            "vocabulary)");
  o.spec_type = "ngram";
  o.draft_min = 5;
  o.draft_max = 3;
  EXPECT_EQ(ErrorOf(o), "--draft-min 5 is more than --draft-max 3");
  o.spec_type = "none";  // as the engine's own check (EngineConfig::Validate): always
  EXPECT_EQ(ErrorOf(o), "--draft-min 5 is more than --draft-max 3");
  o.spec_type = "ngram";
  o.draft_min = 0;
  auto setup = ResolveEngineOptions(o, *model_, tokenizer_);
  ASSERT_TRUE(setup.ok()) << setup.error();
  EXPECT_EQ(setup->spec.type, SpecType::kNgram);
  EXPECT_EQ(setup->config.spec.draft_max, 3);
}

TEST_F(EngineSetupTest, BadSizesAndTypes) {
  kvserve::EngineOptions o = Small();
  o.n_parallel = 2000;
  EXPECT_EQ(ErrorOf(o), "-np 2000: must be between 1 and 1024");
  o = Small();
  o.n_ctx = 1;
  EXPECT_EQ(ErrorOf(o), "-c must be at least 2, -np at least 1 and -t not negative");
  o = Small();
  o.kv_memory_bytes = 4096;
  EXPECT_EQ(ErrorOf(o),
            "--kv-memory 4096 bytes holds 1 blocks of 4096 bytes (16 positions); need at least 2");
  o = Small();
  o.cache_type_k = "q9";
  EXPECT_EQ(ErrorOf(o).rfind("--cache-type-k: ", 0), 0u) << ErrorOf(o);
  o = Small();
  o.max_batch_tokens = 0;
  EXPECT_EQ(ErrorOf(o), "--max-batch-tokens 0: must be between 1 and 65536");
}

}  // namespace
}  // namespace kvs::engine_setup_test
