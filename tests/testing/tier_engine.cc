#include "testing/tier_engine.h"

#include <gtest/gtest.h>

#include "engine/kv_format_factory.h"

namespace kvs::testing {

TierEngine::TierEngine(const Model& model, KvTypes types, const std::string& dir, int32_t n_blocks,
                       KvTierConfig tier)
    : pool_(2), builder_(model, nullptr, pool_, KvFormatWithTypes(types)) {
  EngineConfig cfg;
  cfg.n_ctx = 256;
  cfg.max_seqs = 4;
  cfg.max_batch_tokens = 32;  // prompts prefill in chunks: loads and chunks interleave
  cfg.n_blocks = n_blocks;
  cfg.watermark_blocks = 0;
  cfg.verify_each_step = true;  // the pool's invariants (held loads included) every step
  tier.dir = dir;
  cfg.kv_disk = tier;
  auto local = builder_.Local(cfg);
  EXPECT_TRUE(local.ok()) << local.error();
  if (local.ok()) local_ = std::move(*local);
}

Served TierEngine::Serve(const std::vector<std::vector<int32_t>>& prompts, const BlockHash& key) {
  Served run;
  for (const std::vector<int32_t>& prompt : prompts) {
    RequestOptions o;
    o.max_tokens = 8;
    o.sampling.temperature = 0;
    o.cache_key = key;
    std::vector<int32_t> out;
    int32_t disk = -1;
    auto id = engine().Submit(prompt, o, [&](const TokenEvent& e) {
      if (e.token >= 0) out.push_back(e.token);
      if (disk < 0)
        disk = engine().connectors().tier("disk")
                   ? e.tier_tokens[engine().connectors().tier("disk")->index()]
                   : 0;
    });
    EXPECT_TRUE(id.ok()) << id.error();
    for (int i = 0; i < 10000 && engine().HasWork(); ++i) EXPECT_TRUE(engine().Step().ok());
    EXPECT_FALSE(engine().HasWork());
    run.tokens.push_back(out);
    run.disk_tokens.push_back(disk);
  }
  if (const KvTier* tier = engine().connectors().tier("disk")) run.tier = tier->stats();
  return run;
}

}  // namespace kvs::testing
