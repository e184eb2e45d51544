// The disk block store (kv/block_store.h): put/get/contains/erase by hash, LRU by size within
// its capacity with pinned blocks kept, an index rebuilt from the directory on reopen (a
// restart), crash leftovers removed and foreign files left alone.
#include "kv/block_store.h"
#include "testing/temp_dir.h"

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace kvs {
namespace {

using testing::TempDir;

std::vector<uint8_t> Bytes(size_t n, uint8_t fill) {
  return std::vector<uint8_t>(n, fill);
}

TEST(BlockHashHex, RoundTripsAndRefusesOtherNames) {
  const BlockHash h{0x0123456789abcdefull, 0xfedcba9876543210ull};
  EXPECT_EQ(BlockHashHex(h), "fedcba98765432100123456789abcdef");
  BlockHash back;
  ASSERT_TRUE(ParseBlockHashHex(BlockHashHex(h), &back));
  EXPECT_EQ(back, h);
  EXPECT_FALSE(ParseBlockHashHex("fedcba98765432100123456789abcde", &back));   // short
  EXPECT_FALSE(ParseBlockHashHex("fedcba98765432100123456789abcdeg", &back));  // not hex
  EXPECT_FALSE(ParseBlockHashHex("FEDCBA98765432100123456789ABCDEF", &back));  // upper case
}

TEST(DiskBlockStore, PutGetContainsErase) {
  TempDir dir;
  auto store = DiskBlockStore::Open(dir.path(), 1 << 20);
  ASSERT_TRUE(store.ok()) << store.error();
  const BlockHash a{1, 2}, b{3, 4};
  EXPECT_FALSE((*store)->Contains(a));
  EXPECT_FALSE((*store)->Get(a).ok());
  ASSERT_TRUE((*store)->Put(a, Bytes(100, 7)).ok());
  ASSERT_TRUE((*store)->Put(b, Bytes(50, 9)).ok());
  EXPECT_TRUE((*store)->Contains(a));
  EXPECT_EQ(*(*store)->Get(a), Bytes(100, 7));
  EXPECT_EQ((*store)->usage_bytes(), 150u);
  ASSERT_TRUE((*store)->Put(a, Bytes(10, 1)).ok()) << "replacing";
  EXPECT_EQ(*(*store)->Get(a), Bytes(10, 1));
  EXPECT_EQ((*store)->usage_bytes(), 60u);
  (*store)->Erase(a);
  EXPECT_FALSE((*store)->Contains(a));
  EXPECT_NE(access((dir.path() + "/" + BlockHashHex(a) + ".kvb").c_str(), F_OK), 0);
  EXPECT_EQ((*store)->num_blocks(), 1);
}

TEST(DiskBlockStore, EvictsTheLeastRecentlyUsedUnpinnedBlocks) {
  TempDir dir;
  auto store = DiskBlockStore::Open(dir.path(), 300);
  ASSERT_TRUE(store.ok());
  const BlockHash h1{1, 0}, h2{2, 0}, h3{3, 0}, h4{4, 0};
  ASSERT_TRUE((*store)->Put(h1, Bytes(100, 1)).ok());
  ASSERT_TRUE((*store)->Put(h2, Bytes(100, 2)).ok());
  ASSERT_TRUE((*store)->Put(h3, Bytes(100, 3)).ok());
  (*store)->Pin(h1, true);
  ASSERT_TRUE((*store)->Get(h2).ok());  // h2 used: h3 is now the least recently used unpinned
  ASSERT_TRUE((*store)->Put(h4, Bytes(100, 4)).ok());
  EXPECT_TRUE((*store)->Contains(h1)) << "pinned";
  EXPECT_TRUE((*store)->Contains(h2));
  EXPECT_FALSE((*store)->Contains(h3));
  EXPECT_TRUE((*store)->Contains(h4));
  EXPECT_EQ((*store)->usage_bytes(), 300u);
  EXPECT_FALSE((*store)->Put(BlockHash{5, 0}, Bytes(301, 5)).ok()) << "larger than the store";
}

TEST(DiskBlockStore, ReopenRebuildsTheIndexAndCleansCrashLeftovers) {
  TempDir dir;
  const BlockHash a{11, 12}, b{13, 14};
  {
    auto store = DiskBlockStore::Open(dir.path(), 1 << 20);
    ASSERT_TRUE(store.ok());
    ASSERT_TRUE((*store)->Put(a, Bytes(64, 1)).ok());
    ASSERT_TRUE((*store)->Put(b, Bytes(32, 2)).ok());
  }
  // A crash mid-write leaves a temporary file (its writer, a child that exited, is gone); a
  // live process's temporary file (another server sharing the directory: our parent here) is
  // its write in progress and stays; a user's file and a directory under a block's name are
  // not blocks.
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  const std::string dead =
      dir.path() + "/." + BlockHashHex(a) + ".kvb.tmp." + std::to_string(child) + ".0";
  const std::string live =
      dir.path() + "/." + BlockHashHex(b) + ".kvb.tmp." + std::to_string(getppid()) + ".0";
  std::ofstream(dead) << "partial";
  std::ofstream(live) << "being written";
  std::ofstream(dir.path() + "/notes.txt") << "mine";
  ASSERT_EQ(mkdir((dir.path() + "/" + BlockHashHex(BlockHash{9, 9}) + ".kvb").c_str(), 0755), 0);
  auto store = DiskBlockStore::Open(dir.path(), 1 << 20);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->num_blocks(), 2);
  EXPECT_EQ((*store)->usage_bytes(), 96u);
  EXPECT_EQ(*(*store)->Get(a), Bytes(64, 1));
  EXPECT_FALSE((*store)->Contains(BlockHash{9, 9}));
  EXPECT_NE(access(dead.c_str(), F_OK), 0);
  EXPECT_EQ(access(live.c_str(), F_OK), 0);
  EXPECT_EQ((*store)->rejected_at_open(), 1);  // the directory under a block's name
  EXPECT_EQ(access((dir.path() + "/notes.txt").c_str(), F_OK), 0);
  // A smaller capacity on reopen trims to it.
  auto small = DiskBlockStore::Open(dir.path(), 64);
  ASSERT_TRUE(small.ok());
  EXPECT_LE((*small)->usage_bytes(), 64u);
}

TEST(DiskBlockStore, AnUnusableDirectoryIsAnErrorNotACrash) {
  TempDir dir;
  std::ofstream(dir.path() + "/file") << "x";
  EXPECT_FALSE(DiskBlockStore::Open(dir.path() + "/file", 1 << 20).ok()) << "a file, not a dir";
  EXPECT_FALSE(DiskBlockStore::Open(dir.path() + "/a/b/c", 1 << 20).ok()) << "parent missing";
}

}  // namespace
}  // namespace kvs
