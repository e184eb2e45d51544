// The disk tier under the prefix cache (issue #20) with the real stories models: blocks written
// by one engine are loaded by the next (a restart) and by the same engine after its RAM pool let
// them go, with every greedy token equal to a cold run, for every KV type and both codecs; a
// stored block that is torn, truncated, bit-flipped, of another salt, KV type or model, empty, or
// a directory is a miss (recomputed, counted, removed), never loaded; and a directory that
// vanishes, cannot be written or fills up turns the tier off while serving goes on unchanged.
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_builder.h"
#include "kv/block_store.h"
#include "testing/temp_dir.h"
#include "testing/test_models.h"
#include "testing/tier_engine.h"

namespace kvs {
namespace {

namespace fs = std::filesystem;

constexpr const char* kModel = "stories260K.gguf";

using testing::Served;
using testing::TempDir;
using testing::TierEngine;

// Prompts of ~70 tokens (four full blocks of 16, then a tail), different from their second token.
std::vector<std::vector<int32_t>> Prompts(const Model& model, int32_t n = 3) {
  const int32_t vocab = model.config().n_vocab - 3;
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t p = 0; p < n; ++p) {
    std::vector<int32_t> prompt = {1};
    for (int32_t i = 1; i < 70 + p; ++i)
      prompt.push_back(3 + (p * 97 + i * 31 + i * i * 7) % vocab);
    prompts.push_back(prompt);
  }
  return prompts;
}

std::vector<std::vector<int32_t>> Cold(const Model& model, KvTypes types,
                                       const std::vector<std::vector<int32_t>>& prompts) {
  TierEngine cold(model, types, "");
  return cold.Serve(prompts).tokens;
}

struct TypeCase {
  KvTypes types;
  BlockCodec codec;
};

class TierIdentity : public ::testing::TestWithParam<TypeCase> {};

TEST_P(TierIdentity, BlocksFromDiskGiveTheComputedTokens) {
  auto model = testing::LoadTestModel(kModel);
  if (!model) GTEST_SKIP() << kModel << " not found (set KVSERVE_TEST_MODELS)";
  const TypeCase c = GetParam();
  const auto prompts = Prompts(*model);
  const auto cold = Cold(*model, c.types, prompts);
  TempDir dir;
  KvTierConfig tier;
  tier.codec = c.codec;
  {
    TierEngine first(*model, c.types, dir.path(), 64, tier);
    ASSERT_TRUE(first.ok());
    const Served run = first.Serve(prompts);
    EXPECT_EQ(run.tokens, cold);
    first.engine().connectors().Flush(/*wait=*/true);
    EXPECT_EQ(first.engine().connectors().tier("disk")->stats().blocks_written,
              3 * 4);  // the prompts' full blocks
  }
  // A restart: the next engine finds every prompt's blocks on disk, loads them, and computes
  // only the tails.
  TierEngine second(*model, c.types, dir.path(), 64, tier);
  ASSERT_TRUE(second.ok());
  const Served run = second.Serve(prompts);
  EXPECT_EQ(run.tokens, cold);
  EXPECT_EQ(run.tier.hits, 3 * 4);
  EXPECT_EQ(run.tier.corrupt, 0);
  EXPECT_EQ(run.disk_tokens, (std::vector<int32_t>{64, 64, 64}));
}

std::vector<TypeCase> AllTypeCases() {
  std::vector<TypeCase> cases;
  for (KvType t : kAllKvTypes) {
    for (BlockCodec codec : {BlockCodec::kRaw, BlockCodec::kZstd}) cases.push_back({{t, t}, codec});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(EveryKvType, TierIdentity, ::testing::ValuesIn(AllTypeCases()),
                         [](const ::testing::TestParamInfo<TypeCase>& info) {
                           return std::string(KvTypeName(info.param.types.k)) + "_" +
                                  BlockCodecName(info.param.codec);
                         });

// The file of the first block of prompt under dir.
std::string FirstBlockFile(Engine& engine, const std::string& dir,
                           const std::vector<int32_t>& prompt, const BlockHash& key = {}) {
  return dir + "/" + BlockHashHex(engine.kv().HashFullBlocks(prompt, key).at(0)) + ".kvb";
}

std::vector<uint8_t> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void WriteAll(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

// Every way a stored block can be wrong, applied to the first block of the first prompt: the
// next engine must not load it (nor, the chain broken, the blocks after it), must count it as
// corrupt, remove it, and give the cold run's tokens.
// The tiers are a list of kinds, asked in the table's order; a disk tier alone is the first of the
// engine's list, labelled by its store, and its loads count at its place in a token's event.
TEST(KvTier, TheDiskTierIsAnEntryOfTheListUnderItsLabel) {
  EXPECT_EQ(TierNames(), (std::vector<std::string>{"disk", "redis"}));
  auto model = testing::LoadTestModel(kModel);
  if (!model) GTEST_SKIP() << kModel << " not found (set KVSERVE_TEST_MODELS)";
  const KvTypes f16{KvType::kF16, KvType::kF16};
  const auto prompts = Prompts(*model);
  TempDir dir;
  {
    TierEngine first(*model, f16, dir.path());
    ASSERT_TRUE(first.ok());
    first.Serve(prompts);
    first.engine().connectors().Flush(/*wait=*/true);
  }
  TierEngine e(*model, f16, dir.path());
  ASSERT_TRUE(e.ok());
  ASSERT_EQ(e.engine().connectors().tiers().size(), 1u);
  const KvTier& disk = *e.engine().connectors().tiers()[0];
  EXPECT_EQ(disk.name(), "disk");
  EXPECT_EQ(disk.index(), 0);
  EXPECT_EQ(e.engine().connectors().tier("disk"), &disk);
  EXPECT_EQ(e.engine().connectors().tier("redis"), nullptr);
  const Served run = e.Serve(prompts);  // reads tier_tokens[0]
  EXPECT_EQ(run.disk_tokens, (std::vector<int32_t>{64, 64, 64}));
  // A local store knows its size: the figures a shared one leaves at -1.
  EXPECT_TRUE(run.tier.up);
  EXPECT_EQ(run.tier.blocks_stored, 12);
  EXPECT_GT(run.tier.usage_bytes, 0);
  EXPECT_GT(run.tier.capacity_bytes, run.tier.usage_bytes);
  EXPECT_EQ(run.tier.errors, 0);
}

TEST(KvTier, AnythingWrongOnDiskIsAMissNeverLoaded) {
  auto model = testing::LoadTestModel(kModel);
  if (!model) GTEST_SKIP() << kModel << " not found (set KVSERVE_TEST_MODELS)";
  auto other_model = testing::LoadTestModel("stories-hd64-3M.gguf");
  const KvTypes f32{KvType::kF32, KvType::kF32};
  const auto prompts = Prompts(*model, 1);
  const auto cold = Cold(*model, f32, prompts);
  const BlockHash salted{0x5a17, 0x5a17};

  // Pristine stores: this model and KV type (unsalted and salted), another KV type, another model.
  TempDir good, salt, q8, other;
  std::string good_file, salted_file, q8_file, other_file;
  {
    TierEngine e(*model, f32, good.path());
    e.Serve(prompts);
    e.engine().connectors().Flush(true);
    good_file = FirstBlockFile(e.engine(), good.path(), prompts[0]);
  }
  {
    TierEngine e(*model, f32, salt.path());
    e.Serve(prompts, salted);
    e.engine().connectors().Flush(true);
    salted_file = FirstBlockFile(e.engine(), salt.path(), prompts[0], salted);
  }
  {
    TierEngine e(*model, {KvType::kQ8_0, KvType::kQ8_0}, q8.path());
    e.Serve(prompts);
    e.engine().connectors().Flush(true);
    q8_file = FirstBlockFile(e.engine(), q8.path(), prompts[0]);
  }
  if (other_model) {
    TierEngine e(*other_model, f32, other.path());
    e.Serve(prompts);
    e.engine().connectors().Flush(true);
    other_file = FirstBlockFile(e.engine(), other.path(), prompts[0]);
  }
  const std::vector<uint8_t> pristine = ReadAll(good_file);
  ASSERT_GT(pristine.size(), 200u);

  struct Damage {
    const char* what;
    std::function<void(const std::string& path)> apply;
  };
  const std::vector<Damage> damages = {
      {"truncated to half",
       [&](const std::string& p) {
         WriteAll(p,
                  std::vector<uint8_t>(pristine.begin(), pristine.begin() + pristine.size() / 2));
       }},
      {"truncated to its header",
       [&](const std::string& p) {
         WriteAll(p, std::vector<uint8_t>(pristine.begin(), pristine.begin() + 40));
       }},
      {"empty", [&](const std::string& p) { WriteAll(p, {}); }},
      {"a flipped bit in the header",
       [&](const std::string& p) {
         auto b = pristine;
         b[24] ^= 0x10;
         WriteAll(p, b);
       }},
      {"a flipped bit in the payload",
       [&](const std::string& p) {
         auto b = pristine;
         b[b.size() - 100] ^= 0x01;
         WriteAll(p, b);
       }},
      {"a flipped checksum",
       [&](const std::string& p) {
         auto b = pristine;
         b.back() ^= 0x80;
         WriteAll(p, b);
       }},
      {"a block of another cache_salt",
       [&](const std::string& p) { WriteAll(p, ReadAll(salted_file)); }},
      {"a block of another KV type", [&](const std::string& p) { WriteAll(p, ReadAll(q8_file)); }},
      {"a block of another model",
       [&](const std::string& p) {
         if (!other_file.empty()) WriteAll(p, ReadAll(other_file));
       }},
      {"a directory",
       [&](const std::string& p) {
         fs::remove(p);
         fs::create_directory(p);
       }},
      // Neither may block a read (a FIFO's open waits for a writer) or be followed.
      {"a FIFO",
       [&](const std::string& p) {
         fs::remove(p);
         ASSERT_EQ(::mkfifo(p.c_str(), 0644), 0);
       }},
      {"a symbolic link to a good copy",
       [&](const std::string& p) {
         WriteAll(p + ".real", pristine);
         fs::remove(p);
         fs::create_symlink(p + ".real", p);
       }},
  };
  // Each damage before the engine starts (its index rebuild meets it) and while it runs (a
  // load meets it).
  for (bool running : {false, true}) {
    for (const Damage& d : damages) {
      if (std::string(d.what) == "a block of another model" && other_file.empty()) continue;
      SCOPED_TRACE(std::string(d.what) + (running ? ", while running" : ", before start"));
      TempDir dir;
      fs::copy(good.path(), dir.path(),
               fs::copy_options::recursive | fs::copy_options::overwrite_existing);
      const std::string victim = dir.path() + "/" + fs::path(good_file).filename().string();
      if (!running) d.apply(victim);
      TierEngine e(*model, f32, dir.path());
      ASSERT_TRUE(e.ok());
      if (running) d.apply(victim);
      const Served run = e.Serve(prompts);
      EXPECT_EQ(run.tokens, cold);
      EXPECT_EQ(run.tier.corrupt, 1);
      EXPECT_EQ(run.tier.hits, 0);  // the chain broke at its first block: nothing loaded
      EXPECT_EQ(run.disk_tokens[0], 0);
      // Recomputed and written again (write-through): the next engine loads all of it.
      e.engine().connectors().Flush(true);
      EXPECT_EQ(ReadAll(victim), pristine);
    }
  }
}

// Every block of a prompt damaged: one pass finds them all (the blocks after the first bad one
// are still checked), so the recompute rewrites them all and the next engine loads the prompt.
TEST(KvTier, EveryBadBlockOfAChainIsFoundInOnePass) {
  auto model = testing::LoadTestModel(kModel);
  if (!model) GTEST_SKIP() << kModel << " not found (set KVSERVE_TEST_MODELS)";
  const KvTypes f16{KvType::kF16, KvType::kF16};
  const auto prompts = Prompts(*model, 1);
  const auto cold = Cold(*model, f16, prompts);
  TempDir dir;
  std::vector<BlockHash> hashes;
  {
    TierEngine e(*model, f16, dir.path());
    e.Serve(prompts);
    e.engine().connectors().Flush(true);
    hashes = e.engine().kv().HashFullBlocks(prompts[0], {});
  }
  ASSERT_EQ(hashes.size(), 4u);
  for (const BlockHash& h : hashes) {
    const std::string path = dir.path() + "/" + BlockHashHex(h) + ".kvb";
    auto bytes = ReadAll(path);
    bytes[bytes.size() - 50] ^= 0x04;
    WriteAll(path, bytes);
  }
  {
    TierEngine e(*model, f16, dir.path());
    const Served run = e.Serve(prompts);
    EXPECT_EQ(run.tokens, cold);
    EXPECT_EQ(run.tier.corrupt, 4);
    EXPECT_EQ(run.tier.hits, 0);
    e.engine().connectors().Flush(true);
  }
  TierEngine e(*model, f16, dir.path());
  const Served run = e.Serve(prompts);
  EXPECT_EQ(run.tokens, cold);
  EXPECT_EQ(run.tier.hits, 4);
  EXPECT_EQ(run.tier.corrupt, 0);
}

// A directory with contents under a block's name cannot be removed: that block is never loaded
// nor written again (its write would fail every time and stop the tier), and the tier stays up.
TEST(KvTier, ANameHeldByADirectoryCostsThatBlockOnly) {
  auto model = testing::LoadTestModel(kModel);
  if (!model) GTEST_SKIP() << kModel << " not found (set KVSERVE_TEST_MODELS)";
  const KvTypes f16{KvType::kF16, KvType::kF16};
  const auto prompts = Prompts(*model, 1);
  const auto cold = Cold(*model, f16, prompts);
  TempDir dir;
  std::string victim;
  {
    TierEngine e(*model, f16, dir.path());
    e.Serve(prompts);
    e.engine().connectors().Flush(true);
    victim = FirstBlockFile(e.engine(), dir.path(), prompts[0]);
  }
  for (bool running : {true, false}) {
    SCOPED_TRACE(running ? "found by a load" : "found at start");
    const auto occupy = [&] {
      fs::remove_all(victim);
      fs::create_directory(victim);
      WriteAll(victim + "/mine", {1, 2, 3});
    };
    if (!running) occupy();
    TierEngine e(*model, f16, dir.path());
    if (running) occupy();
    for (int pass = 0; pass < 6; ++pass) {  // more passes than failures that stop a tier
      const Served run = e.Serve(prompts);
      EXPECT_EQ(run.tokens, cold);
      e.engine().connectors().ResetPrefixCache();
      e.engine().connectors().tier("disk")->WaitForWrites(10000);
    }
    const KvTierStats s = e.engine().connectors().tier("disk")->stats();
    EXPECT_FALSE(s.failed);
    EXPECT_EQ(s.corrupt, 1);
    EXPECT_EQ(s.hits, 0);  // the chain's first block: nothing after it loads either
    EXPECT_TRUE(fs::is_directory(victim));
    EXPECT_TRUE(fs::exists(victim + "/mine"));  // someone's file, never touched
  }
}

// A store that stops accepting writes: serving goes on with the cold run's tokens, the tier says
// it failed, and nothing crashes. Each case: the directory removed under a running engine, a
// directory nobody may write into, a file size limit (a full disk: writes fail with EFBIG).
TEST(KvTier, UnwritableStoreTurnsTheTierOffAndServingGoesOn) {
  auto model = testing::LoadTestModel(kModel);
  if (!model) GTEST_SKIP() << kModel << " not found (set KVSERVE_TEST_MODELS)";
  const KvTypes f16{KvType::kF16, KvType::kF16};
  const auto prompts = Prompts(*model);
  const auto cold = Cold(*model, f16, prompts);
  {
    SCOPED_TRACE("vanished directory");
    TempDir dir;
    TierEngine e(*model, f16, dir.path() + "/store");
    ASSERT_TRUE(e.ok());
    fs::remove_all(dir.path() + "/store");
    const Served run = e.Serve(prompts);
    e.engine().connectors().Flush(true);
    EXPECT_EQ(run.tokens, cold);
    EXPECT_TRUE(e.engine().connectors().tier("disk")->stats().failed);
    EXPECT_FALSE(
        e.engine().connectors().tier("disk")->stats().up);  // kvserve:kv_tier_up{tier="disk"} 0
    EXPECT_EQ(e.engine().connectors().tier("disk")->stats().blocks_written, 0);
  }
  {
    // Root may write anywhere chmod forbids; /proc/self is a directory nobody may create files in
    // (EPERM for root, EACCES for others under chmod): the tier is off from the start, as a
    // read-only --kv-disk is (docs/SECURITY.md), and serving goes on without it.
    SCOPED_TRACE("read-only directory");
    TempDir dir;
    std::string ro = dir.path();
    if (::geteuid() == 0) {
      ro = "/proc/self";
    } else {
      fs::permissions(ro, fs::perms::owner_read | fs::perms::owner_exec);
    }
    TierEngine e(*model, f16, ro);
    ASSERT_TRUE(e.ok());
    EXPECT_EQ(e.engine().connectors().tier("disk"), nullptr);
    const Served run = e.Serve(prompts);
    EXPECT_EQ(run.tokens, cold);
  }
  {
    SCOPED_TRACE("full disk");
    TempDir dir;
    TierEngine e(*model, f16, dir.path());
    ASSERT_TRUE(e.ok());
    struct rlimit old;
    ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
    struct rlimit small = old;
    small.rlim_cur = 1000;  // smaller than any block file
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
    const Served run = e.Serve(prompts);
    e.engine().connectors().Flush(true);
    ::setrlimit(RLIMIT_FSIZE, &old);
    EXPECT_EQ(run.tokens, cold);
    EXPECT_TRUE(e.engine().connectors().tier("disk")->stats().failed);
    EXPECT_EQ(e.engine().connectors().tier("disk")->stats().blocks_written, 0);
  }
}

// In one engine: blocks that left the RAM pool (LRU reuse under a small pool, or a reset of the
// prefix cache) come back from disk, under both policies; write-back writes a block only as it
// leaves RAM.
TEST(KvTier, BlocksThatLeftRamComeBackFromDisk) {
  auto model = testing::LoadTestModel(kModel);
  if (!model) GTEST_SKIP() << kModel << " not found (set KVSERVE_TEST_MODELS)";
  const KvTypes f16{KvType::kF16, KvType::kF16};
  const auto prompts = Prompts(*model, 4);
  const auto cold = Cold(*model, f16, prompts);
  for (KvDiskPolicy policy : {KvDiskPolicy::kWriteThrough, KvDiskPolicy::kWriteBack}) {
    SCOPED_TRACE(policy == KvDiskPolicy::kWriteThrough ? "write-through" : "write-back");
    TempDir dir;
    KvTierConfig tier;
    tier.policy = policy;
    // 12 usable blocks: one prompt (5 blocks with its output) at a time, and little else.
    TierEngine e(*model, f16, dir.path(), 13, tier);
    ASSERT_TRUE(e.ok());
    Served run = e.Serve({prompts[0]});
    const int64_t written_after_one = e.engine().connectors().tier("disk")->stats().blocks_written;
    if (policy == KvDiskPolicy::kWriteBack) {
      e.engine().connectors().tier("disk")->WaitForWrites(10000);
      EXPECT_EQ(e.engine().connectors().tier("disk")->stats().blocks_written,
                0);  // all of it still in RAM
    } else {
      e.engine().connectors().tier("disk")->WaitForWrites(10000);
      EXPECT_EQ(e.engine().connectors().tier("disk")->stats().blocks_written, 4);
    }
    (void)written_after_one;
    // Three other prompts push the first out of the pool; then it comes back from disk.
    run = e.Serve({prompts[1], prompts[2], prompts[3]});
    EXPECT_EQ(run.tokens, std::vector<std::vector<int32_t>>(cold.begin() + 1, cold.end()));
    e.engine().connectors().tier("disk")->WaitForWrites(10000);
    run = e.Serve({prompts[0]});
    EXPECT_EQ(run.tokens[0], cold[0]);
    EXPECT_EQ(run.disk_tokens[0], 64);
    // A reset of the prefix cache drops RAM's copy; the disk's serves it again.
    e.engine().connectors().ResetPrefixCache();
    e.engine().connectors().tier("disk")->WaitForWrites(10000);
    const int64_t hits = e.engine().connectors().tier("disk")->stats().hits;
    run = e.Serve({prompts[0]});
    EXPECT_EQ(run.tokens[0], cold[0]);
    EXPECT_EQ(run.tier.hits, hits + 4);
    EXPECT_EQ(run.tier.corrupt, 0);
  }
}

TEST(KvTier, APromptThatWaitsForRoomIsLoadedOnceRoomFreesUp) {
  auto model = testing::LoadTestModel(kModel);
  if (!model) GTEST_SKIP() << kModel << " not found (set KVSERVE_TEST_MODELS)";
  const KvTypes f16{KvType::kF16, KvType::kF16};
  const auto prompts = Prompts(*model, 4);
  const auto cold = Cold(*model, f16, {prompts[0]});
  TempDir dir;
  TierEngine e(*model, f16, dir.path(), 13);  // 12 usable blocks
  ASSERT_TRUE(e.ok());
  e.Serve({prompts[0]});
  e.Serve({prompts[1], prompts[2], prompts[3]});  // prompt 0 leaves RAM; its 4 blocks stay on disk
  e.engine().connectors().tier("disk")->WaitForWrites(10000);
  // A long answer takes every block of the pool ...
  RequestOptions long_answer;
  long_answer.max_tokens = 120;  // 70 + 120 tokens: all 12 blocks
  long_answer.sampling.temperature = 0;
  int32_t produced = 0;
  ASSERT_TRUE(e.engine()
                  .Submit(prompts[1], long_answer,
                          [&](const TokenEvent& ev) {
                            if (ev.token >= 0) ++produced;
                          })
                  .ok());
  for (int i = 0; i < 10000 && produced < 112; ++i) ASSERT_TRUE(e.engine().Step().ok());
  ASSERT_EQ(e.engine().kv().num_free_blocks(), 0);
  // ... while prompt 0 arrives: no block to load into now; it waits, and loads once there is.
  RequestOptions o;
  o.max_tokens = 8;
  o.sampling.temperature = 0;
  std::vector<int32_t> out;
  int32_t disk = -1;
  ASSERT_TRUE(e.engine()
                  .Submit(prompts[0], o,
                          [&](const TokenEvent& ev) {
                            if (ev.token >= 0) out.push_back(ev.token);
                            if (disk < 0) disk = ev.tier_tokens[0];  // the only tier
                          })
                  .ok());
  for (int i = 0; i < 10000 && e.engine().HasWork(); ++i) ASSERT_TRUE(e.engine().Step().ok());
  EXPECT_EQ(out, cold[0]);
  EXPECT_EQ(disk, 64);
}

}  // namespace
}  // namespace kvs
