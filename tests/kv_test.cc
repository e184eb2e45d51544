// The block pool with exact block ids, checking every invariant after each step.
#include <gtest/gtest.h>

#include <vector>

#include "kv/block_pool.h"

namespace kvs {
namespace {

using Ids = std::vector<int32_t>;

void ExpectIntact(const BlockPool& pool) {
  const Status s = pool.VerifyIntegrity();
  EXPECT_TRUE(s.ok()) << s.message();
}

Ids Take(BlockPool& pool, int32_t n) {
  Ids ids;
  EXPECT_TRUE(pool.Allocate(n, &ids));
  ExpectIntact(pool);
  return ids;
}

TEST(BlockPool, HandsOutBlocksInOrderNeverTheNullBlock) {
  BlockPool pool(8);
  ExpectIntact(pool);
  EXPECT_EQ(pool.num_free(), 7);
  EXPECT_EQ(Take(pool, 3), (Ids{1, 2, 3}));
  EXPECT_EQ(Take(pool, 2), (Ids{4, 5}));
  EXPECT_EQ(pool.num_free(), 2);
  for (int32_t id : {1, 2, 3, 4, 5}) EXPECT_EQ(pool.ref_count(id), 1);
}

TEST(BlockPool, FreedBlocksJoinTheTailInLruOrder) {
  BlockPool pool(8);
  Ids a = Take(pool, 3);  // 1 2 3
  Ids b = Take(pool, 2);  // 4 5
  ASSERT_TRUE(pool.Free(b).ok());
  ExpectIntact(pool);
  ASSERT_TRUE(pool.Free(a).ok());
  ExpectIntact(pool);
  // Never-used 6, 7 first, then the blocks in the order they were freed.
  EXPECT_EQ(Take(pool, 7), (Ids{6, 7, 4, 5, 1, 2, 3}));
}

TEST(BlockPool, RunningOutIsANormalResultAndChangesNothing) {
  BlockPool pool(4);
  Ids a = Take(pool, 2);
  Ids none;
  EXPECT_FALSE(pool.Allocate(2, &none));
  EXPECT_TRUE(none.empty());
  EXPECT_EQ(pool.num_free(), 1);
  ExpectIntact(pool);
  EXPECT_EQ(Take(pool, 1), (Ids{3}));
  EXPECT_FALSE(pool.Allocate(1, &none));
  EXPECT_FALSE(pool.Allocate(-1, &none));
  EXPECT_TRUE(Take(pool, 0).empty());
}

TEST(BlockPool, SharedBlocksReturnWhenTheLastHolderFrees) {
  BlockPool pool(6);
  Ids a = Take(pool, 2);  // 1 2
  ASSERT_TRUE(pool.Ref(1).ok());
  ASSERT_TRUE(pool.Ref(2).ok());
  EXPECT_EQ(pool.ref_count(1), 2);
  ASSERT_TRUE(pool.Free(a).ok());
  ExpectIntact(pool);
  EXPECT_EQ(pool.num_free(), 3);  // still held by the fork
  EXPECT_EQ(pool.ref_count(2), 1);
  ASSERT_TRUE(pool.Free(a).ok());
  ExpectIntact(pool);
  EXPECT_EQ(pool.num_free(), 5);
  EXPECT_EQ(Take(pool, 5), (Ids{3, 4, 5, 1, 2}));
}

TEST(BlockPool, MisuseIsRefusedWithoutDamage) {
  BlockPool pool(5);
  Ids a = Take(pool, 2);                    // 1 2
  EXPECT_FALSE(pool.Free(Ids{0}).ok());     // the null block
  EXPECT_FALSE(pool.Free(Ids{9}).ok());     // not a block
  EXPECT_FALSE(pool.Free(Ids{3}).ok());     // free already
  EXPECT_FALSE(pool.Free(Ids{1, 1}).ok());  // more frees than references
  EXPECT_FALSE(pool.Ref(4).ok());
  EXPECT_FALSE(pool.Ref(kNullBlock).ok());
  ExpectIntact(pool);
  EXPECT_EQ(pool.ref_count(1), 1);
  EXPECT_EQ(pool.num_free(), 2);
}

}  // namespace
}  // namespace kvs
