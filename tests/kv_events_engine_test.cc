// The engine's KV events (issue #22, acceptance 4) on the real stories260K model: every block the
// RAM prefix index stores or removes is published exactly once, in order, under the chain hash
// the prefix cache uses, with its parent and token ids. Checked after every step: replaying the
// events from the start gives exactly the index's blocks then. The pool is small, so LRU reuse
// removes blocks, and /reset_prefix_cache and a tier's loads play their part.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_builder.h"
#include "kv/block_store.h"
#include "kv/kv_events.h"
#include "testing/temp_dir.h"
#include "testing/test_models.h"

namespace kvs {
namespace {

constexpr const char* kModel = "stories260K.gguf";

std::vector<int32_t> Prompt(const Model& model, int32_t p, int32_t n) {
  const int32_t vocab = model.config().n_vocab - 3;
  std::vector<int32_t> prompt = {1};
  for (int32_t i = 1; i < n; ++i) prompt.push_back(3 + (p * 61 + i * 29 + i * i * 3) % vocab);
  return prompt;
}

// A router's view: replays the events into an index, checking each one as it goes.
class Index {
 public:
  void Apply(const KvEvent& event, int32_t block_size) {
    if (std::holds_alternative<KvAllBlocksCleared>(event)) {
      blocks_.clear();
      ++cleared_;
    } else if (const auto* s = std::get_if<KvBlockStored>(&event)) {
      EXPECT_EQ(s->block_size, block_size);
      EXPECT_EQ(s->token_ids.size(), s->hashes.size() * block_size);
      EXPECT_EQ(s->medium, std::optional<std::string>(kKvMediumCpu));
      for (size_t i = 0; i < s->hashes.size(); ++i) {
        const std::string h = BlockHashHex(s->hashes[i]);
        EXPECT_TRUE(blocks_.insert(h).second) << "stored twice without a removal: " << h;
        tokens_[h].assign(s->token_ids.begin() + i * block_size,
                          s->token_ids.begin() + (i + 1) * block_size);
        parents_[h] =
            i == 0 ? (s->parent ? BlockHashHex(*s->parent) : "") : BlockHashHex(s->hashes[i - 1]);
        ++stored_;
      }
    } else if (const auto* r = std::get_if<KvBlockRemoved>(&event)) {
      for (const BlockHash& hash : r->hashes) {
        EXPECT_EQ(blocks_.erase(BlockHashHex(hash)), 1u) << "removed but not stored";
        ++removed_;
      }
    }
  }
  const std::set<std::string>& blocks() const { return blocks_; }
  const std::vector<int32_t>& tokens(const std::string& h) { return tokens_[h]; }
  const std::string& parent(const std::string& h) { return parents_[h]; }
  int stored_ = 0, removed_ = 0, cleared_ = 0;

 private:
  std::set<std::string> blocks_;
  std::map<std::string, std::vector<int32_t>> tokens_;
  std::map<std::string, std::string> parents_;
};

std::set<std::string> IndexOf(const Engine& engine) {
  std::set<std::string> out;
  for (const auto& [hash, id] : engine.kv().CachedBlocks()) out.insert(BlockHashHex(hash));
  return out;
}

TEST(KvEvents, EveryIndexChangeIsPublishedOnceInOrderWithThePrefixCachesHashes) {
  auto model = testing::LoadTestModel(kModel);
  if (!model) GTEST_SKIP() << kModel << " not found (set KVSERVE_TEST_MODELS)";
  testing::TempDir dir;
  KvEventRecorder recorder;
  ThreadPool pool(2);
  EngineBuilder builder(*model, nullptr, pool, KvFormatWithTypes({KvType::kF16, KvType::kF16}));
  EngineConfig cfg;
  cfg.n_ctx = 256;
  cfg.max_seqs = 2;
  cfg.max_batch_tokens = 32;
  cfg.n_blocks = 20;  // a few prompts' worth: LRU reuses cached blocks
  cfg.watermark_blocks = 0;
  cfg.verify_each_step = true;
  cfg.kv_disk.dir = dir.path();  // reloads from disk index blocks too
  cfg.kv_event_sink = &recorder;
  auto local = builder.Local(cfg);
  ASSERT_TRUE(local.ok()) << local.error();
  Engine& engine = *local->engine;
  const int32_t bs = engine.kv().block_size();

  Index index;
  size_t seen = 0;
  auto check = [&](const char* when) {
    const std::vector<KvEvent> events = recorder.events();
    for (; seen < events.size(); ++seen) index.Apply(events[seen], bs);
    EXPECT_EQ(index.blocks(), IndexOf(engine)) << when;
  };
  check("at start");
  EXPECT_EQ(index.cleared_, 1);  // AllBlocksCleared first

  std::map<std::string, std::vector<int32_t>> expected_tokens;  // hash -> the prompt's tokens
  auto serve = [&](int32_t p, int32_t n) {
    const std::vector<int32_t> prompt = Prompt(*model, p, n);
    const std::vector<BlockHash> hashes = engine.kv().HashFullBlocks(prompt, {});
    for (size_t i = 0; i < hashes.size(); ++i) {
      expected_tokens[BlockHashHex(hashes[i])].assign(prompt.begin() + i * bs,
                                                      prompt.begin() + (i + 1) * bs);
    }
    RequestOptions o;
    o.max_tokens = 4;
    o.sampling.temperature = 0;
    ASSERT_TRUE(engine.Submit(prompt, o, [](const TokenEvent&) {}).ok());
    for (int i = 0; i < 10000 && engine.HasWork(); ++i) {
      ASSERT_TRUE(engine.Step().ok());
      check("after a step");
    }
  };
  for (int32_t p = 0; p < 6; ++p) serve(p, 60 + p);  // 6 prompts of 3 full blocks in 19 blocks
  EXPECT_GT(index.removed_, 0);                      // LRU reuse removed some
  engine.connectors().ResetPrefixCache();
  check("after /reset_prefix_cache");
  EXPECT_TRUE(index.blocks().empty());
  engine.connectors().Flush(/*wait=*/true);
  serve(0, 60);  // from disk: its blocks enter the index by a load
  EXPECT_GT(engine.connectors().tier("disk")->stats().hits, 0);

  // Every prompt block's event carried the prompt's tokens and its chain parent.
  int checked = 0;
  for (const auto& [hash, tokens] : expected_tokens) {
    if (index.tokens(hash).empty()) continue;  // never indexed (a duplicate stayed private)
    EXPECT_EQ(index.tokens(hash), tokens) << hash;
    ++checked;
  }
  EXPECT_GE(checked, 6 * 3);
  const std::vector<BlockHash> first = engine.kv().HashFullBlocks(Prompt(*model, 0, 60), {});
  EXPECT_EQ(index.parent(BlockHashHex(first[0])), "");
  EXPECT_EQ(index.parent(BlockHashHex(first[1])), BlockHashHex(first[0]));
  EXPECT_EQ(index.parent(BlockHashHex(first[2])), BlockHashHex(first[1]));
}

}  // namespace
}  // namespace kvs
