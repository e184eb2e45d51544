// KV cache groups (kv/kv_group.h) on a synthetic two-group model: a full-attention group and a
// sliding-window group of 8 positions over blocks of 4. Exact block ids through growth, the
// window's releases, prefix hits under both groups' rules, forks, rollbacks and frees, with the
// manager's integrity checked after every change.
#include <gtest/gtest.h>

#include <vector>

#include "kv/kv_cache_manager.h"
#include "kv/kv_storage.h"

namespace kvs::kv_group_test {
namespace {

constexpr int32_t kBlock = 4;
constexpr int32_t kWindow = 8;

std::vector<int32_t> BlockValues(const std::vector<BlockId>& blocks) {
  std::vector<int32_t> out;
  for (BlockId b : blocks) out.push_back(b.value);
  return out;
}

class KvGroups : public ::testing::Test {
 protected:
  KvGroups() : kv_(/*n_blocks=*/32, kBlock, 0, {KvGroupSpec{}, KvGroupSpec{kWindow}}) {
    kv_.set_prefix_caching(true);
  }
  void Check() {
    const Status s = kv_.VerifyIntegrity();
    ASSERT_TRUE(s.ok()) << s.message();
  }
  // Appends n positions of tokens to seq and commits its full blocks, as the engine does after
  // computing them.
  void Grow(SeqId seq, const std::vector<int32_t>& tokens, int32_t n) {
    std::vector<BlockCopy> copies;
    ASSERT_TRUE(kv_.Append(seq, n, &copies));
    std::vector<BlockHash> hashes;
    const int32_t held = kv_.Table(seq).num_tokens;
    kv_.HashFullBlocks(tokens.data(), held, {}, &hashes);
    kv_.CommitFullBlocks(seq, hashes, held, tokens);
    Check();
  }
  KvCacheManager kv_;
};

std::vector<int32_t> GroupTokens(int32_t n, int32_t salt = 0) {
  std::vector<int32_t> t;
  for (int32_t i = 0; i < n; ++i) t.push_back(100 + salt * 1000 + i);
  return t;
}

TEST_F(KvGroups, EachGroupHasItsTableAndTheWindowReleasesWhatNoQueryReads) {
  const SeqId a{1};
  const std::vector<int32_t> tokens = GroupTokens(20);
  Grow(a, tokens, 12);  // positions 0..11: 3 blocks in each group, from one pool
  EXPECT_EQ(kv_.num_groups(), 2);
  EXPECT_EQ(BlockValues(kv_.Table(a, 0).blocks), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(BlockValues(kv_.Table(a, 1).blocks), (std::vector<int32_t>{4, 5, 6}));
  EXPECT_EQ(kv_.num_free_blocks(), 31 - 6);
  // Position 12's query reads 5..12: block 0 (positions 0..3) of the window group goes back.
  EXPECT_EQ(kv_.BlocksToAppend(a, 1), 2);
  Grow(a, tokens, 1);
  EXPECT_EQ(BlockValues(kv_.Table(a, 0).blocks), (std::vector<int32_t>{1, 2, 3, 7}));
  EXPECT_EQ(BlockValues(kv_.Table(a, 1).blocks), (std::vector<int32_t>{0, 5, 6, 8}));
  EXPECT_EQ(kv_.num_free_blocks(), 31 - 7);
  // Position 16 (a chunk 13..16 starts at 13, which reads 6..13): block 1 stays until then.
  Grow(a, tokens, 4);
  EXPECT_EQ(BlockValues(kv_.Table(a, 1).blocks), (std::vector<int32_t>{0, 5, 6, 8, 10}));
  Grow(a, tokens, 1);  // position 17 reads 10..17: blocks 0..1 (positions 0..7) released
  EXPECT_EQ(BlockValues(kv_.Table(a, 1).blocks), (std::vector<int32_t>{0, 0, 6, 8, 10}));
  EXPECT_EQ(kv_.Table(a, 1).num_tokens, 18);
  EXPECT_EQ(kv_.Slot(a, 17, 1), 10 * kBlock + 1);
  // Freeing releases each group's blocks; the window's released blocks were returned already.
  kv_.Free(a);
  Check();
  EXPECT_EQ(kv_.num_free_blocks(), 31);
}

TEST_F(KvGroups, APrefixHitNeedsEveryFullBlockButOnlyTheWindowsBlocks) {
  const std::vector<int32_t> tokens = GroupTokens(40);
  const SeqId a{1};
  Grow(a, tokens, 20);  // blocks 1..5 and 6..10
  Grow(a, tokens, 4);   // 11 and 12; position 20 reads 13..20: window blocks 0..2 released
  ASSERT_EQ(BlockValues(kv_.Table(a, 0).blocks), (std::vector<int32_t>{1, 2, 3, 4, 5, 11}));
  ASSERT_EQ(BlockValues(kv_.Table(a, 1).blocks), (std::vector<int32_t>{0, 0, 0, 9, 10, 12}));
  std::vector<BlockHash> hashes;
  kv_.HashFullBlocks(tokens.data(), 40, {}, &hashes);
  // A hit of L blocks ends at position 4L, whose query reads 4L-7..4L: window blocks L-2, L-1.
  // All 6 blocks are a hit; the window group gives only its last two.
  PrefixMatch m = kv_.Match(hashes, 30);
  EXPECT_EQ(m.n_tokens, 24);
  EXPECT_EQ(BlockValues(m.blocks), (std::vector<int32_t>{1, 2, 3, 4, 5, 11}));
  ASSERT_EQ(m.group_blocks.size(), 1u);
  EXPECT_EQ(BlockValues(m.group_blocks[0]), (std::vector<int32_t>{0, 0, 0, 0, 10, 12}));
  EXPECT_EQ(m.n_free, 0);
  const SeqId b{2};
  kv_.AdoptPrefix(b, m);
  Check();
  EXPECT_EQ(kv_.Table(b, 1).num_tokens, 24);
  kv_.Free(b);
  Check();
  // The released window blocks 6, 7, 8 still hold their hashes in the free list, behind the
  // never-used 13..31: take all of those, and the window group forgets blocks 0..2.
  std::vector<BlockId> taken;
  ASSERT_TRUE(kv_.HoldBlocks(19 + 3, &taken));
  EXPECT_FALSE(kv_.CachedBlock(hashes[2], 1).has_value());
  EXPECT_TRUE(kv_.CachedBlock(hashes[2], 0).has_value());
  // The whole prefix is still a hit: its window never reads those blocks.
  EXPECT_EQ(kv_.Match(hashes, 30).n_tokens, 24);
  // A prompt that shares only the first 3 blocks: the full group has them, but a hit of 3
  // needs window blocks 1 and 2 (of 2: 0 and 1; of 1: 0), so there is none.
  std::vector<int32_t> other = tokens;
  other[12] = 7;
  std::vector<BlockHash> other_hashes;
  kv_.HashFullBlocks(other.data(), 40, {}, &other_hashes);
  EXPECT_EQ(kv_.Match(other_hashes, 30).n_tokens, 0);
  kv_.ReleaseHeld(taken, {}, 0);
  Check();
}

TEST_F(KvGroups, ForksRollbacksAndFreesKeepEveryGroupConsistent) {
  const std::vector<int32_t> tokens = GroupTokens(30);
  const SeqId a{1}, b{2};
  Grow(a, tokens, 12);
  Grow(a, tokens, 2);  // position 12 reads 5..12: window block 0 (0..3) released
  ASSERT_TRUE(kv_.Fork(a, b).ok());
  Check();
  EXPECT_EQ(BlockValues(kv_.Table(b, 1).blocks), BlockValues(kv_.Table(a, 1).blocks));
  EXPECT_EQ(kv_.Table(b, 1).blocks[0], kNullBlock);
  // The child writes its shared partial last block: each group copies its own.
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(kv_.Append(b, 1, &copies));
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_EQ(copies[0].src, kv_.Table(a, 0).blocks[3]);
  EXPECT_EQ(copies[1].src, kv_.Table(a, 1).blocks[3]);
  Check();
  // A rollback of drafts within the last block, in both groups.
  ASSERT_TRUE(kv_.Append(b, 3, &copies));
  ASSERT_TRUE(kv_.Truncate(b, 15).ok());
  Check();
  EXPECT_EQ(kv_.Table(b, 0).num_tokens, 15);
  EXPECT_EQ(kv_.Table(b, 1).num_tokens, 15);
  EXPECT_EQ(kv_.BlocksFreedBy(b), 2);  // its copies of the last block, one in each group
  // Position 15's window (8..15) let b release window block 1 (4..7): a rollback to 13, whose
  // query would read 6..13, is refused and changes nothing.
  ASSERT_EQ(kv_.Table(b, 1).blocks[1], kNullBlock);
  EXPECT_FALSE(kv_.Truncate(b, 13).ok());
  EXPECT_EQ(kv_.Table(b, 0).num_tokens, 15);
  EXPECT_EQ(kv_.Table(b, 1).num_tokens, 15);
  EXPECT_TRUE(kv_.Truncate(b, 15).ok());
  Check();
  kv_.Free(a);
  kv_.Free(b);
  Check();
  EXPECT_EQ(kv_.num_free_blocks(), 31);
  // Token eviction rewrites slots of one table: refused with more than one group.
  Grow(a, tokens, 8);
  EXPECT_FALSE(kv_.Compact(a, 0, 4).ok());
}

TEST_F(KvGroups, OneFullGroupMatchesAsBefore) {
  KvCacheManager one(16, kBlock);
  one.set_prefix_caching(true);
  const std::vector<int32_t> tokens = GroupTokens(12);
  std::vector<BlockCopy> copies;
  ASSERT_TRUE(one.Append(SeqId{1}, 12, &copies));
  std::vector<BlockHash> hashes;
  one.HashFullBlocks(tokens.data(), 12, {}, &hashes);
  one.CommitFullBlocks(SeqId{1}, hashes, 12, tokens);
  const PrefixMatch m = one.Match(hashes, 12);  // never the last token's block
  EXPECT_EQ(BlockValues(m.blocks), (std::vector<int32_t>{1, 2}));
  EXPECT_TRUE(m.group_blocks.empty());
  EXPECT_EQ(m.n_free, 0);
}

// Layers that share slabs (an engine's storage for a model of several KV groups): a block id
// holds one block in each slab, the layers of a slab see the same memory, and whole-block reads
// and writes (the tiers') are refused, since a block holds only its group's layers.
TEST(KvSlabs, LayersOfOneSlabShareItsBlocksAndABlockCostsOneLayerPerSlab) {
  const KvGeometry g{4, 2, 16, 16, 16, KvType::kF16, KvType::kF16};
  const KvFormatPtr format = PlainKvFormat(g);
  const KvStorage own(format, 8);
  EXPECT_EQ(own.num_slabs(), 4);
  EXPECT_FALSE(own.shares_slabs());
  EXPECT_EQ(own.block_bytes(), g.BytesPerBlock());
  KvStorage shared(format, 8, {0, 1, 0, 1});
  EXPECT_EQ(shared.num_slabs(), 2);
  EXPECT_TRUE(shared.shares_slabs());
  EXPECT_EQ(shared.block_bytes() * 2, g.BytesPerBlock());
  EXPECT_EQ(shared.bytes(), shared.block_bytes() * 8);
  EXPECT_EQ(shared.layers()[0].k, shared.layers()[2].k);
  EXPECT_EQ(shared.layers()[1].v, shared.layers()[3].v);
  EXPECT_NE(shared.layers()[0].k, shared.layers()[1].k);
  EXPECT_EQ(shared.slab_layers(), (std::vector<int32_t>{0, 1}));
  std::vector<uint8_t> bytes;
  EXPECT_FALSE(shared.ReadBlock(1, &bytes).ok());
  EXPECT_FALSE(shared.WriteBlock(1, std::vector<uint8_t>(g.BytesPerBlock())).ok());
  EXPECT_TRUE(own.ReadBlock(1, &bytes).ok());
  EXPECT_EQ(bytes.size(), g.BytesPerBlock());
}

}  // namespace
}  // namespace kvs::kv_group_test
