// The block pool with exact block ids, checking every invariant after each step.
#include <gtest/gtest.h>

#include <span>
#include <utility>
#include <vector>

#include "kv/block_pool.h"
#include "kv/kv_cache_manager.h"

namespace kvs {
namespace {

using Ids = std::vector<int32_t>;  // expected block ids, as plain numbers
using Blocks = std::vector<BlockId>;

Ids Raw(std::span<const BlockId> blocks) {
  Ids ids;
  for (BlockId b : blocks) ids.push_back(b.value);
  return ids;
}
Blocks B(std::initializer_list<int32_t> ids) {
  Blocks blocks;
  for (int32_t id : ids) blocks.push_back(BlockId{id});
  return blocks;
}

void ExpectIntact(const BlockPool& pool) {
  const Status s = pool.VerifyIntegrity();
  EXPECT_TRUE(s.ok()) << s.message();
}

Blocks Take(BlockPool& pool, int32_t n) {
  Blocks ids;
  EXPECT_TRUE(pool.Allocate(n, &ids));
  ExpectIntact(pool);
  return ids;
}

TEST(BlockPool, HandsOutBlocksInOrderNeverTheNullBlock) {
  BlockPool pool(8);
  ExpectIntact(pool);
  EXPECT_EQ(pool.num_free(), 7);
  EXPECT_EQ(Raw(Take(pool, 3)), (Ids{1, 2, 3}));
  EXPECT_EQ(Raw(Take(pool, 2)), (Ids{4, 5}));
  EXPECT_EQ(pool.num_free(), 2);
  for (int32_t id : {1, 2, 3, 4, 5}) EXPECT_EQ(pool.ref_count(BlockId{id}), 1);
}

TEST(BlockPool, FreedBlocksJoinTheTailInLruOrder) {
  BlockPool pool(8);
  Blocks a = Take(pool, 3);  // 1 2 3
  Blocks b = Take(pool, 2);  // 4 5
  ASSERT_TRUE(pool.Free(b).ok());
  ExpectIntact(pool);
  ASSERT_TRUE(pool.Free(a).ok());
  ExpectIntact(pool);
  // Never-used 6, 7 first, then the blocks in the order they were freed.
  EXPECT_EQ(Raw(Take(pool, 7)), (Ids{6, 7, 4, 5, 1, 2, 3}));
}

TEST(BlockPool, RunningOutIsANormalResultAndChangesNothing) {
  BlockPool pool(4);
  Blocks a = Take(pool, 2);
  Blocks none;
  EXPECT_FALSE(pool.Allocate(2, &none));
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(pool.num_free(), 1);
  ExpectIntact(pool);
  EXPECT_EQ(Raw(Take(pool, 1)), (Ids{3}));
  EXPECT_FALSE(pool.Allocate(1, &none));
  EXPECT_FALSE(pool.Allocate(-1, &none));
  EXPECT_TRUE(Take(pool, 0).empty());
}

TEST(BlockPool, SharedBlocksReturnWhenTheLastHolderFrees) {
  BlockPool pool(6);
  Blocks a = Take(pool, 2);  // 1 2
  ASSERT_TRUE(pool.Ref(BlockId{1}).ok());
  ASSERT_TRUE(pool.Ref(BlockId{2}).ok());
  EXPECT_EQ(pool.ref_count(BlockId{1}), 2);
  ASSERT_TRUE(pool.Free(a).ok());
  ExpectIntact(pool);
  EXPECT_EQ(pool.num_free(), 3);  // still held by the fork
  EXPECT_EQ(pool.ref_count(BlockId{2}), 1);
  ASSERT_TRUE(pool.Free(a).ok());
  ExpectIntact(pool);
  EXPECT_EQ(pool.num_free(), 5);
  EXPECT_EQ(Raw(Take(pool, 5)), (Ids{3, 4, 5, 1, 2}));
}

TEST(BlockPool, MisuseIsRefusedWithoutDamage) {
  BlockPool pool(5);
  Blocks a = Take(pool, 2);                 // 1 2
  EXPECT_FALSE(pool.Free(B({0})).ok());     // the null block
  EXPECT_FALSE(pool.Free(B({9})).ok());     // not a block
  EXPECT_FALSE(pool.Free(B({3})).ok());     // free already
  EXPECT_FALSE(pool.Free(B({1, 1})).ok());  // more frees than references
  EXPECT_FALSE(pool.Ref(BlockId{4}).ok());
  EXPECT_FALSE(pool.Ref(kNullBlock).ok());
  ExpectIntact(pool);
  EXPECT_EQ(pool.ref_count(BlockId{1}), 1);
  EXPECT_EQ(pool.num_free(), 2);
  // A refused list leaves Free's scratch counts clean: the same list is fine once it is valid.
  ASSERT_TRUE(pool.Ref(BlockId{1}).ok());
  ASSERT_TRUE(pool.Free(B({1, 1})).ok());
  EXPECT_EQ(pool.ref_count(BlockId{1}), 0);
  ExpectIntact(pool);
}

// --- Block tables over the pool: fake sequences, exact block ids, integrity after each step.

void ExpectIntact(const KvCacheManager& kv) {
  const Status s = kv.VerifyIntegrity();
  EXPECT_TRUE(s.ok()) << s.message();
}

bool Append(KvCacheManager& kv, SeqId seq, int32_t n, std::vector<BlockCopy>* copies = nullptr) {
  std::vector<BlockCopy> ignored;
  const bool ok = kv.Append(seq, n, copies ? copies : &ignored);
  ExpectIntact(kv);
  return ok;
}

TEST(KvCacheManager, AppendGrowsAcrossBlockBoundaries) {
  KvCacheManager kv(9, 4);  // 8 usable blocks of 4 positions
  EXPECT_EQ(kv.BlocksToAppend(SeqId{7}, 5), 2);
  ASSERT_TRUE(Append(kv, SeqId{7}, 5));  // positions 0..4
  EXPECT_EQ(Raw(kv.Table(SeqId{7}).blocks), (Ids{1, 2}));
  EXPECT_EQ(kv.Table(SeqId{7}).num_tokens, 5);
  EXPECT_EQ(kv.BlocksToAppend(SeqId{7}, 3), 0);  // fits the partial block
  ASSERT_TRUE(Append(kv, SeqId{7}, 3));
  EXPECT_EQ(Raw(kv.Table(SeqId{7}).blocks), (Ids{1, 2}));
  EXPECT_EQ(kv.BlocksToAppend(SeqId{7}, 1), 1);
  ASSERT_TRUE(Append(kv, SeqId{7}, 1));  // position 8 opens block 3
  EXPECT_EQ(Raw(kv.Table(SeqId{7}).blocks), (Ids{1, 2, 3}));
  ASSERT_TRUE(Append(kv, SeqId{8}, 2));  // a second sequence
  EXPECT_EQ(Raw(kv.Table(SeqId{8}).blocks), (Ids{4}));
  ASSERT_TRUE(Append(kv, SeqId{7}, 4));
  EXPECT_EQ(Raw(kv.Table(SeqId{7}).blocks), (Ids{1, 2, 3, 5}));
  // Slots: block id * 4 + offset.
  EXPECT_EQ(kv.Slot(SeqId{7}, 0), 4);
  EXPECT_EQ(kv.Slot(SeqId{7}, 5), 9);
  EXPECT_EQ(kv.Slot(SeqId{7}, 12), 20);
  EXPECT_EQ(kv.Slot(SeqId{8}, 1), 17);
  EXPECT_EQ(kv.num_free_blocks(), 3);
}

TEST(KvCacheManager, ExhaustionIsANormalAllOrNothingResult) {
  KvCacheManager kv(5, 4);                // 4 usable blocks
  ASSERT_TRUE(Append(kv, SeqId{1}, 10));  // 3 blocks
  EXPECT_FALSE(Append(kv, SeqId{2}, 5));  // needs 2, 1 free: nothing taken
  EXPECT_FALSE(kv.Contains(SeqId{2}));
  EXPECT_EQ(kv.num_free_blocks(), 1);
  EXPECT_FALSE(Append(kv, SeqId{1}, 7));  // 10 + 7 = 17 positions need 5 blocks
  EXPECT_EQ(kv.Table(SeqId{1}).num_tokens, 10);
  EXPECT_EQ(Raw(kv.Table(SeqId{1}).blocks), (Ids{1, 2, 3}));
  ASSERT_TRUE(Append(kv, SeqId{2}, 4));
  EXPECT_EQ(Raw(kv.Table(SeqId{2}).blocks), (Ids{4}));
  EXPECT_EQ(kv.num_free_blocks(), 0);
}

TEST(KvCacheManager, FreeReturnsTheTailFirstInLruOrder) {
  KvCacheManager kv(9, 4);
  ASSERT_TRUE(Append(kv, SeqId{1}, 12));  // 1 2 3
  ASSERT_TRUE(Append(kv, SeqId{2}, 4));   // 4
  kv.Free(SeqId{1});
  ExpectIntact(kv);
  EXPECT_FALSE(kv.Contains(SeqId{1}));
  EXPECT_EQ(kv.num_free_blocks(), 7);
  // Free list: 5 6 7 8 (never used), then 3 2 1 (seq 1's tail first).
  ASSERT_TRUE(Append(kv, SeqId{3}, 28));
  EXPECT_EQ(Raw(kv.Table(SeqId{3}).blocks), (Ids{5, 6, 7, 8, 3, 2, 1}));
  kv.Free(SeqId{42});  // unknown: nothing happens
  ExpectIntact(kv);
}

TEST(KvCacheManager, ForkSharesBlocksAndCopiesTheSharedPartialBlockOnWrite) {
  KvCacheManager kv(9, 4);
  ASSERT_TRUE(Append(kv, SeqId{1}, 6));  // 1 2 (block 2 half full)
  ASSERT_TRUE(kv.Fork(SeqId{1}, SeqId{2}).ok());
  ExpectIntact(kv);
  EXPECT_EQ(Raw(kv.Table(SeqId{2}).blocks), (Ids{1, 2}));
  EXPECT_EQ(kv.pool().ref_count(BlockId{1}), 2);
  EXPECT_EQ(kv.pool().ref_count(BlockId{2}), 2);
  EXPECT_EQ(kv.BlocksFreedBy(SeqId{1}), 0);
  // The child writes position 6: block 2 is shared and partial, so it gets a copy.
  EXPECT_EQ(kv.BlocksToAppend(SeqId{2}, 1), 1);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(Append(kv, SeqId{2}, 1, &copies));
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0], (BlockCopy{BlockId{2}, BlockId{3}}));
  EXPECT_EQ(Raw(kv.Table(SeqId{2}).blocks), (Ids{1, 3}));
  EXPECT_EQ(kv.pool().ref_count(BlockId{2}), 1);
  // The parent now holds block 2 alone: its write needs no copy.
  copies.clear();
  EXPECT_EQ(kv.BlocksToAppend(SeqId{1}, 1), 0);
  ASSERT_TRUE(Append(kv, SeqId{1}, 1, &copies));
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(Raw(kv.Table(SeqId{1}).blocks), (Ids{1, 2}));
  // Freeing the parent leaves the shared first block to the child.
  kv.Free(SeqId{1});
  ExpectIntact(kv);
  EXPECT_EQ(kv.pool().ref_count(BlockId{1}), 1);
  EXPECT_EQ(kv.num_free_blocks(), 6);
  EXPECT_FALSE(kv.Fork(SeqId{1}, SeqId{5}).ok());  // no parent
  EXPECT_FALSE(kv.Fork(SeqId{2}, SeqId{2}).ok());  // child exists
  ExpectIntact(kv);
}

TEST(KvCacheManager, ForkAtABlockBoundaryNeedsNoCopy) {
  KvCacheManager kv(9, 4);
  ASSERT_TRUE(Append(kv, SeqId{1}, 8));  // 1 2, both full
  ASSERT_TRUE(kv.Fork(SeqId{1}, SeqId{2}).ok());
  std::vector<BlockCopy> copies;
  EXPECT_EQ(kv.BlocksToAppend(SeqId{2}, 1), 1);
  ASSERT_TRUE(Append(kv, SeqId{2}, 1, &copies));
  ASSERT_TRUE(Append(kv, SeqId{1}, 1, &copies));
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(Raw(kv.Table(SeqId{2}).blocks), (Ids{1, 2, 3}));
  EXPECT_EQ(Raw(kv.Table(SeqId{1}).blocks), (Ids{1, 2, 4}));
}

TEST(KvCacheManager, CopyOnWriteNeedsABlockAndFailsCleanlyWithoutOne) {
  KvCacheManager kv(3, 4);               // 2 usable
  ASSERT_TRUE(Append(kv, SeqId{1}, 6));  // 1 2
  ASSERT_TRUE(kv.Fork(SeqId{1}, SeqId{2}).ok());
  EXPECT_FALSE(Append(kv, SeqId{2}, 1));  // the copy needs a free block
  EXPECT_EQ(Raw(kv.Table(SeqId{2}).blocks), (Ids{1, 2}));
  EXPECT_EQ(kv.Table(SeqId{2}).num_tokens, 6);
  EXPECT_EQ(kv.pool().ref_count(BlockId{2}), 2);
}

TEST(KvCacheManager, ReserveTakesTheWholeContextUpFront) {
  KvCacheManager kv(9, 4);
  ASSERT_TRUE(kv.Reserve(SeqId{1}, 16));  // a contiguous-style reservation: 4 blocks
  ExpectIntact(kv);
  EXPECT_EQ(Raw(kv.Table(SeqId{1}).blocks), (Ids{1, 2, 3, 4}));
  EXPECT_EQ(kv.BlocksToAppend(SeqId{1}, 16), 0);
  ASSERT_TRUE(Append(kv, SeqId{1}, 10));
  EXPECT_EQ(Raw(kv.Table(SeqId{1}).blocks), (Ids{1, 2, 3, 4}));
  EXPECT_FALSE(kv.Reserve(SeqId{2}, 20));  // 5 blocks, 4 free
  EXPECT_EQ(kv.num_free_blocks(), 4);
}

// --- Prefix cache: exact block ids.

std::vector<int32_t> Tokens(int32_t n, int32_t base) {
  std::vector<int32_t> t(n);
  for (int32_t i = 0; i < n; ++i) t[i] = base + i;
  return t;
}

// Runs a sequence as the engine does: hash its full blocks once, adopt the cached prefix,
// append the rest, commit.
PrefixMatch Serve(KvCacheManager& kv, SeqId seq, const std::vector<int32_t>& tokens,
                  const BlockHash& key) {
  const int32_t n = static_cast<int32_t>(tokens.size());
  std::vector<BlockHash> hashes;
  kv.HashFullBlocks(tokens.data(), n, key, &hashes);
  PrefixMatch m = kv.Match(hashes, n);
  if (!m.blocks.empty()) kv.AdoptPrefix(seq, m);
  EXPECT_TRUE(Append(kv, seq, n - m.n_tokens));
  kv.CommitFullBlocks(seq, hashes, n);
  ExpectIntact(kv);
  return m;
}

TEST(PrefixCache, FullAndPartialHitsShareBlocks) {
  KvCacheManager kv(17, 4);
  kv.set_prefix_caching(true);
  const BlockHash key = PrefixCacheKey("model", "f32", "");
  const std::vector<int32_t> a = Tokens(13, 100);  // blocks 1 2 3 full, 4 partial
  EXPECT_EQ(Serve(kv, SeqId{1}, a, key).n_tokens, 0);
  EXPECT_EQ(Raw(kv.Table(SeqId{1}).blocks), (Ids{1, 2, 3, 4}));
  EXPECT_EQ(kv.num_cached_blocks(), 3);
  // Full hit: the same 13 tokens share blocks 1-3 (never the last token's block).
  const PrefixMatch full = Serve(kv, SeqId{2}, a, key);
  EXPECT_EQ(Raw(full.blocks), (Ids{1, 2, 3}));
  EXPECT_EQ(full.n_tokens, 12);
  EXPECT_EQ(Raw(kv.Table(SeqId{2}).blocks), (Ids{1, 2, 3, 5}));
  EXPECT_EQ(kv.pool().ref_count(BlockId{2}), 2);
  // Partial hit: diverging in the middle of the second block shares only the first.
  std::vector<int32_t> b = a;
  b[6] = 999;
  const PrefixMatch partial = Serve(kv, SeqId{3}, b, key);
  EXPECT_EQ(Raw(partial.blocks), (Ids{1}));
  EXPECT_EQ(Raw(kv.Table(SeqId{3}).blocks), (Ids{1, 6, 7, 8}));
  // A prompt of exactly one block: its last token must be computed, so no hit.
  EXPECT_EQ(kv.Match(a.data(), 4, key).n_tokens, 0);
  EXPECT_EQ(kv.Match(a.data(), 5, key).n_tokens, 4);
}

TEST(PrefixCache, HitsAfterTheOwnerFinishedAndLruEvictionTailFirst) {
  KvCacheManager kv(9, 4);  // 8 usable blocks
  kv.set_prefix_caching(true);
  const BlockHash key = PrefixCacheKey("model", "f32", "");
  const std::vector<int32_t> a = Tokens(12, 100);  // 3 full blocks: 1 2 3
  Serve(kv, SeqId{1}, a, key);
  kv.Free(SeqId{1});  // free list: 4 5 6 7 8, then 3 2 1 (tail first); all three keep their hashes
  ExpectIntact(kv);
  EXPECT_EQ(kv.num_cached_blocks(), 3);
  const PrefixMatch m = kv.Match(a.data(), 12, key);
  EXPECT_EQ(Raw(m.blocks), (Ids{1, 2}));  // the third holds the last token: computed again
  EXPECT_EQ(m.n_free, 2);
  // Pressure: another sequence takes 6 blocks: 4-8, then 3 (the chain's tail) is evicted.
  EXPECT_TRUE(Append(kv, SeqId{9}, 24));
  EXPECT_EQ(Raw(kv.Table(SeqId{9}).blocks), (Ids{4, 5, 6, 7, 8, 3}));
  EXPECT_EQ(kv.num_cached_blocks(), 2);
  kv.Free(SeqId{9});  // free list: 2 1, then 3 8 7 6 5 4
  // The chain's head is still cached; its blocks leave the free list from where they are.
  const PrefixMatch again = Serve(kv, SeqId{2}, Tokens(9, 100), key);
  EXPECT_EQ(Raw(again.blocks), (Ids{1, 2}));
  EXPECT_EQ(Raw(kv.Table(SeqId{2}).blocks), (Ids{1, 2, 3}));
  EXPECT_EQ(kv.pool().ref_count(BlockId{1}), 1);
  EXPECT_EQ(kv.num_free_blocks(), 5);
}

// A lower tier's load (engine/kv_tier.h): blocks held outside any table while the loader fills
// them, then indexed (the loaded ones) and freed last first; the uncache listener sees each
// indexed block that LRU hands out again while its bytes are still whole.
TEST(PrefixCache, HeldLoadsEnterTheIndexAndReuseIsReported) {
  KvCacheManager kv(9, 4);  // 8 usable blocks
  kv.set_prefix_caching(true);
  const BlockHash key = PrefixCacheKey("model", "f32", "");
  std::vector<std::pair<int32_t, bool>> uncached;
  kv.set_uncache_listener([&](BlockId id, const BlockHash&, bool reused) {
    uncached.push_back({id.value, reused});
  });
  const std::vector<int32_t> a = Tokens(12, 100);  // blocks 1 2 3
  Serve(kv, SeqId{1}, a, key);
  kv.Free(SeqId{1});  // free list: 4 5 6 7 8, then 3 2 1
  // A load of three blocks for another prompt takes the head of the free list.
  const std::vector<int32_t> b = Tokens(13, 500);
  std::vector<BlockHash> hashes;
  kv.HashFullBlocks(b.data(), 13, key, &hashes);
  std::vector<BlockId> held;
  ASSERT_TRUE(kv.HoldBlocks(3, &held));
  EXPECT_EQ(Raw(held), (Ids{4, 5, 6}));
  EXPECT_EQ(kv.num_held_blocks(), 3);
  EXPECT_TRUE(kv.VerifyIntegrity().ok()) << kv.VerifyIntegrity().message();
  EXPECT_TRUE(uncached.empty());  // none of them was indexed
  // Two of the three loaded (the third failed a check): those two enter the index.
  kv.ReleaseHeld(held, hashes, 2);
  EXPECT_EQ(kv.num_held_blocks(), 0);
  EXPECT_TRUE(kv.VerifyIntegrity().ok()) << kv.VerifyIntegrity().message();
  EXPECT_EQ(kv.num_cached_blocks(), 5);
  const PrefixMatch m = kv.Match(hashes, 13);
  EXPECT_EQ(Raw(m.blocks), (Ids{4, 5}));
  EXPECT_EQ(m.n_free, 2);
  // Free list now: 7 8 3 2 1, then 6 5 4 (released last first). Taking four blocks reuses 7 8
  // (never indexed), then 3 and 2 (indexed: reported as reused, bytes still whole).
  EXPECT_TRUE(Append(kv, SeqId{2}, 16));
  EXPECT_EQ(Raw(kv.Table(SeqId{2}).blocks), (Ids{7, 8, 3, 2}));
  EXPECT_EQ(uncached, (std::vector<std::pair<int32_t, bool>>{{3, true}, {2, true}}));
  // A load whose hash is indexed already (computed meanwhile) stays private and is not indexed.
  // (The free list's head is 1, a's first block: its reuse is reported too.)
  std::vector<BlockId> again;
  ASSERT_TRUE(kv.HoldBlocks(1, &again));
  EXPECT_EQ(Raw(again), (Ids{1}));
  EXPECT_EQ(uncached.back(), (std::pair<int32_t, bool>{1, true}));
  kv.ReleaseHeld(again, std::vector<BlockHash>{hashes[0]}, 1);
  EXPECT_EQ(*kv.CachedBlock(hashes[0]), BlockId{4});
  // Dropping the unused indexed blocks (reset_prefix_cache) reports them as not reused.
  uncached.clear();
  EXPECT_EQ(kv.DropFreeCachedBlocks(), 2);  // 4, 5
  EXPECT_EQ(kv.num_cached_blocks(), 0);
  EXPECT_EQ(uncached.size(), 2u);
  for (const auto& [id, reused] : uncached) EXPECT_FALSE(reused) << id;
  EXPECT_TRUE(kv.VerifyIntegrity().ok());
}

TEST(PrefixCache, SaltsAndModelsNeverShare) {
  KvCacheManager kv(17, 4);
  kv.set_prefix_caching(true);
  const std::vector<int32_t> a = Tokens(9, 100);
  Serve(kv, SeqId{1}, a, PrefixCacheKey("model", "f32", "tenant-a"));
  EXPECT_EQ(kv.Match(a.data(), 9, PrefixCacheKey("model", "f32", "tenant-a")).n_tokens, 8);
  EXPECT_EQ(kv.Match(a.data(), 9, PrefixCacheKey("model", "f32", "tenant-b")).n_tokens, 0);
  EXPECT_EQ(kv.Match(a.data(), 9, PrefixCacheKey("model", "q8_0", "tenant-a")).n_tokens, 0);
  EXPECT_EQ(kv.Match(a.data(), 9, PrefixCacheKey("other", "f32", "tenant-a")).n_tokens, 0);
  KvCacheManager off(17, 4);  // --no-prefix-cache
  Serve(off, SeqId{1}, a, PrefixCacheKey("model", "f32", ""));
  EXPECT_EQ(off.Match(a.data(), 9, PrefixCacheKey("model", "f32", "")).n_tokens, 0);
  EXPECT_EQ(off.num_cached_blocks(), 0);
}

// --- Truncate (rollback): exact block ids, the prefix index checked after each step.

TEST(KvCacheManager, TruncateFreesTheBlocksPastTheNewEndTailFirst) {
  KvCacheManager kv(9, 4);                // 8 usable blocks of 4
  ASSERT_TRUE(Append(kv, SeqId{1}, 14));  // 1 2 3 4 (4 half full)
  ASSERT_TRUE(Append(kv, SeqId{2}, 4));   // 5
  ASSERT_TRUE(kv.Truncate(SeqId{1}, 5).ok());
  ExpectIntact(kv);
  EXPECT_EQ(Raw(kv.Table(SeqId{1}).blocks), (Ids{1, 2}));
  EXPECT_EQ(kv.Table(SeqId{1}).num_tokens, 5);
  EXPECT_EQ(kv.num_free_blocks(), 5);
  // The kept partial block 2 is written in place, no copy; position 8 opens a new block.
  std::vector<BlockCopy> copies;
  EXPECT_EQ(kv.BlocksToAppend(SeqId{1}, 3), 0);
  ASSERT_TRUE(Append(kv, SeqId{1}, 3, &copies));
  EXPECT_TRUE(copies.empty());
  EXPECT_EQ(Raw(kv.Table(SeqId{1}).blocks), (Ids{1, 2}));
  // Free list: 6 7 8 (never used), then 4 3 (the truncated tail, last block first).
  ASSERT_TRUE(Append(kv, SeqId{3}, 20));
  EXPECT_EQ(Raw(kv.Table(SeqId{3}).blocks), (Ids{6, 7, 8, 4, 3}));
  // At a block boundary nothing partial is kept; to 0 the table stays, empty.
  ASSERT_TRUE(kv.Truncate(SeqId{3}, 8).ok());
  ExpectIntact(kv);
  EXPECT_EQ(Raw(kv.Table(SeqId{3}).blocks), (Ids{6, 7}));
  ASSERT_TRUE(kv.Truncate(SeqId{3}, 8).ok());  // to its own length: nothing changes
  EXPECT_EQ(Raw(kv.Table(SeqId{3}).blocks), (Ids{6, 7}));
  ASSERT_TRUE(kv.Truncate(SeqId{3}, 0).ok());
  ExpectIntact(kv);
  EXPECT_TRUE(kv.Contains(SeqId{3}));
  EXPECT_TRUE(kv.Table(SeqId{3}).blocks.empty());
  EXPECT_EQ(kv.num_free_blocks(), 5);
  // Free list: 3 4 8 (the first truncation, last block first), then 7 6.
  ASSERT_TRUE(Append(kv, SeqId{4}, 20));
  EXPECT_EQ(Raw(kv.Table(SeqId{4}).blocks), (Ids{3, 4, 8, 7, 6}));
}

TEST(KvCacheManager, TruncateRefusesBadLengthsWithoutChange) {
  KvCacheManager kv(9, 4);
  ASSERT_TRUE(Append(kv, SeqId{1}, 6));  // 1 2
  EXPECT_FALSE(kv.Truncate(SeqId{1}, 7).ok());
  EXPECT_FALSE(kv.Truncate(SeqId{1}, -1).ok());
  EXPECT_EQ(Raw(kv.Table(SeqId{1}).blocks), (Ids{1, 2}));
  EXPECT_EQ(kv.Table(SeqId{1}).num_tokens, 6);
  EXPECT_TRUE(kv.Truncate(SeqId{5}, 0).ok());  // absent reads as empty
  EXPECT_FALSE(kv.Contains(SeqId{5}));
  EXPECT_FALSE(kv.Truncate(SeqId{5}, 1).ok());
  ExpectIntact(kv);
}

TEST(KvCacheManager, TruncateDropsAReservationPastTheNewEnd) {
  KvCacheManager kv(9, 4);
  ASSERT_TRUE(kv.Reserve(SeqId{1}, 16));  // 1 2 3 4
  ASSERT_TRUE(Append(kv, SeqId{1}, 10));
  ASSERT_TRUE(kv.Truncate(SeqId{1}, 3).ok());
  ExpectIntact(kv);
  EXPECT_EQ(Raw(kv.Table(SeqId{1}).blocks), (Ids{1}));
  EXPECT_EQ(kv.num_free_blocks(), 7);
}

TEST(PrefixCache, TruncateUnindexesAKeptPartialBlockAndFreedBlocksKeepTheirHash) {
  KvCacheManager kv(17, 4);
  kv.set_prefix_caching(true);
  const BlockHash key = PrefixCacheKey("model", "f32", "");
  const std::vector<int32_t> a = Tokens(13, 100);
  Serve(kv, SeqId{1}, a, key);  // 1 2 3 indexed, 4 partial
  ASSERT_EQ(kv.num_cached_blocks(), 3);
  ASSERT_TRUE(kv.Truncate(SeqId{1}, 6).ok());
  ExpectIntact(kv);
  EXPECT_EQ(Raw(kv.Table(SeqId{1}).blocks), (Ids{1, 2}));
  EXPECT_EQ(kv.Table(SeqId{1}).hashes.size(), 1u);
  // Block 2 (kept, now partial) left the index; block 3 (freed) keeps its hash like any freed
  // block, though with its parent gone no chain reaches it until LRU eviction reuses it.
  EXPECT_EQ(kv.num_cached_blocks(), 2);
  EXPECT_EQ(Raw(kv.Match(a.data(), 13, key).blocks), (Ids{1}));
  // Different tokens at positions 6, 7 are written into block 2 in place, then indexed anew.
  std::vector<int32_t> b(a.begin(), a.begin() + 6);
  b.push_back(7);
  b.push_back(8);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(Append(kv, SeqId{1}, 2, &copies));
  EXPECT_TRUE(copies.empty());
  std::vector<BlockHash> hashes;
  kv.HashFullBlocks(b.data(), 8, key, &hashes);
  kv.CommitFullBlocks(SeqId{1}, hashes, 8);
  ExpectIntact(kv);
  EXPECT_EQ(kv.num_cached_blocks(), 3);
  b.push_back(9);
  EXPECT_EQ(Raw(kv.Match(b.data(), 9, key).blocks), (Ids{1, 2}));
  EXPECT_EQ(Raw(kv.Match(a.data(), 13, key).blocks), (Ids{1}));
}

TEST(PrefixCache, TruncateOfASharedPrefixCopiesBeforeWritingAndKeepsTheOtherHolderIntact) {
  KvCacheManager kv(17, 4);
  kv.set_prefix_caching(true);
  const BlockHash key = PrefixCacheKey("model", "f32", "");
  const std::vector<int32_t> a = Tokens(13, 100);
  Serve(kv, SeqId{1}, a, key);  // 1 2 3 4
  Serve(kv, SeqId{2}, a, key);  // shares 1 2 3, then 5
  ASSERT_EQ(Raw(kv.Table(SeqId{2}).blocks), (Ids{1, 2, 3, 5}));
  ASSERT_TRUE(kv.Truncate(SeqId{2}, 6).ok());
  ExpectIntact(kv);
  EXPECT_EQ(Raw(kv.Table(SeqId{2}).blocks), (Ids{1, 2}));
  EXPECT_EQ(kv.pool().ref_count(BlockId{2}), 2);
  EXPECT_EQ(kv.pool().ref_count(BlockId{3}), 1);  // seq 1's alone now
  EXPECT_EQ(kv.pool().ref_count(BlockId{5}), 0);
  // Block 2 is partial in seq 2's table: out of the index even though seq 1 holds it full
  // (were seq 1 to finish first, seq 2 would write it in place).
  EXPECT_EQ(kv.num_cached_blocks(), 2);
  EXPECT_EQ(Raw(kv.Match(a.data(), 13, key).blocks), (Ids{1}));
  // Seq 2's next write copies shared block 2 first (free list: 6..16, then 5).
  std::vector<BlockCopy> copies;
  EXPECT_EQ(kv.BlocksToAppend(SeqId{2}, 1), 1);
  ASSERT_TRUE(Append(kv, SeqId{2}, 1, &copies));
  EXPECT_EQ(copies, (std::vector<BlockCopy>{{BlockId{2}, BlockId{6}}}));
  EXPECT_EQ(Raw(kv.Table(SeqId{2}).blocks), (Ids{1, 6}));
  EXPECT_EQ(Raw(kv.Table(SeqId{1}).blocks), (Ids{1, 2, 3, 4}));
  EXPECT_EQ(kv.pool().ref_count(BlockId{2}), 1);
  kv.Free(SeqId{1});
  ExpectIntact(kv);
  EXPECT_EQ(kv.num_cached_blocks(), 2);  // 1 (held by seq 2) and 3 (free, hash kept)
}

// --- Block hashes: the keys are fixed, and a kept hash list matches as the tokens do.

TEST(PrefixCache, BlockHashesAreTheKeysTheyAlwaysWere) {
  // Recorded from the one-buffer XXH3 of (parent, key, tokens) that the streamed hash
  // replaced: prefix-cache keys must not change (covers XXH3's short, mid and long inputs).
  const std::vector<std::pair<int32_t, std::vector<BlockHash>>> golden = {
      {4,
       {{0x702727cb6eb0d552ull, 0xfc4dc4c52d81a9a7ull},
        {0xb3edcab6442c94eeull, 0x772ffbcac734a239ull},
        {0xf545afc3c3329b51ull, 0x3049c2eb9ca2320full}}},
      {16,
       {{0xa815a29ff40fe5d0ull, 0xfbfb794ea4ee3c1cull},
        {0x04e5a03f69312247ull, 0x931a6b66aeabfadbull},
        {0x657589ee3f44b203ull, 0x7c62c156b17d15c1ull}}},
      {64,
       {{0xe2ebca308133d8ebull, 0x12f577db84ddeec2ull},
        {0xfb768cfc98b1f7eeull, 0xa1dde962d1764a73ull},
        {0x0d0466cf29fa2793ull, 0x7274af18f3ad033full}}},
  };
  const BlockHash key = PrefixCacheKey("model", "q8_0/f16", "salt");
  EXPECT_EQ(key, (BlockHash{0xa2f5486afd16c9a2ull, 0xafd045ee15197b60ull}));
  for (const auto& [block_size, want] : golden) {
    KvCacheManager kv(9, block_size);
    kv.set_prefix_caching(true);
    std::vector<int32_t> t(3 * block_size + 1);
    for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int32_t>(i * 7919 % 32000);
    std::vector<BlockHash> hashes;
    kv.HashFullBlocks(t.data(), static_cast<int32_t>(t.size()), key, &hashes);
    EXPECT_EQ(hashes, want) << block_size;
  }
}

TEST(PrefixCache, MatchOnAKeptHashListEqualsMatchOnTheTokens) {
  KvCacheManager kv(33, 4);
  kv.set_prefix_caching(true);
  const BlockHash key = PrefixCacheKey("model", "f32", "");
  const std::vector<int32_t> a = Tokens(14, 100);
  Serve(kv, SeqId{1}, a, key);  // 1 2 3 indexed
  kv.Free(SeqId{1});            // all three free, still indexed: n_free counts them
  for (int32_t diverge : {-1, 1, 5, 9}) {
    std::vector<int32_t> t = Tokens(18, 100);
    if (diverge >= 0) t[diverge] = 999;
    std::vector<BlockHash> hashes;
    kv.HashFullBlocks(t.data(), 18, key, &hashes);  // every full block: more than a match uses
    ASSERT_EQ(hashes.size(), 4u);
    for (int32_t n = 0; n <= 18; ++n) {
      const int64_t hashed = kv.num_blocks_hashed();
      const PrefixMatch kept = kv.Match(hashes, n);
      EXPECT_EQ(kv.num_blocks_hashed(), hashed);  // the kept list is not hashed again
      const PrefixMatch fresh = kv.Match(t.data(), n, key);
      EXPECT_EQ(Raw(kept.blocks), Raw(fresh.blocks)) << diverge << " " << n;
      EXPECT_EQ(kept.hashes, fresh.hashes);
      EXPECT_EQ(kept.n_tokens, fresh.n_tokens);
      EXPECT_EQ(kept.n_free, fresh.n_free);
    }
  }
  std::vector<BlockHash> hashes;
  kv.HashFullBlocks(a.data(), 14, key, &hashes);
  EXPECT_EQ(Raw(kv.Match(hashes, 14).blocks), (Ids{1, 2, 3}));
  EXPECT_EQ(kv.Match(hashes, 14).n_free, 3);
  // A list shorter than the tokens bounds the match; hashing it again adds nothing.
  EXPECT_EQ(Raw(kv.Match(std::span(hashes).first(2), 14).blocks), (Ids{1, 2}));
  const int64_t hashed = kv.num_blocks_hashed();
  kv.HashFullBlocks(a.data(), 14, key, &hashes);
  EXPECT_EQ(kv.num_blocks_hashed(), hashed);
  EXPECT_EQ(hashes.size(), 3u);
}

TEST(PrefixCache, CommitRegistersOnlyBlocksWithAHash) {
  KvCacheManager kv(17, 4);
  kv.set_prefix_caching(true);
  const BlockHash key = PrefixCacheKey("model", "f32", "");
  const std::vector<int32_t> t = Tokens(12, 100);
  ASSERT_TRUE(Append(kv, SeqId{1}, 12));  // 1 2 3, all computed
  // Positions 7..11 are drafts in flight: only the 7 committed tokens are hashed.
  std::vector<BlockHash> hashes;
  kv.HashFullBlocks(t.data(), 7, key, &hashes);
  kv.CommitFullBlocks(SeqId{1}, hashes, 12);
  ExpectIntact(kv);
  EXPECT_EQ(kv.Table(SeqId{1}).hashes.size(), 1u);
  EXPECT_EQ(kv.num_cached_blocks(), 1);
}

TEST(KvCacheManager, WatermarkLimitsAdmission) {
  KvCacheManager kv(11, 4, /*watermark_blocks=*/2);  // 10 usable
  EXPECT_TRUE(kv.CanAdmit(8));
  EXPECT_FALSE(kv.CanAdmit(9));
}

}  // namespace
}  // namespace kvs
