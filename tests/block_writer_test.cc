// The disk tier's writer (kv/block_writer.h): blocks offered are written off the caller's thread,
// a full queue drops and counts instead of blocking, a failing store turns the tier off once
// (what is queued is dropped, later offers too) and Flush is bounded. A gated fake store makes
// every case deterministic without sleeps.
#include "kv/block_writer.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <map>
#include <mutex>

namespace kvs {
namespace {

class GatedStore final : public BlockStore {
 public:
  std::string_view name() const override { return "gated"; }
  bool Contains(const BlockHash& h) const override {
    std::lock_guard<std::mutex> lock(mu_);
    return blocks_.contains(h.lo);
  }
  Status Put(const BlockHash& h, std::span<const uint8_t> file) override {
    std::unique_lock<std::mutex> lock(mu_);
    ++entered_;
    changed_.notify_all();
    changed_.wait(lock, [&] { return open_; });
    if (fail_) return Status::Error("No space left on device");
    blocks_[h.lo] = std::vector<uint8_t>(file.begin(), file.end());
    return Status::Ok();
  }
  Expected<std::vector<uint8_t>> Get(const BlockHash& h) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = blocks_.find(h.lo);
    if (it == blocks_.end()) return Status::Error("absent");
    return it->second;
  }
  void Erase(const BlockHash& h) override {
    std::lock_guard<std::mutex> lock(mu_);
    blocks_.erase(h.lo);
  }
  void SetOpen(bool open) {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = open;
    changed_.notify_all();
  }
  void SetFail(bool fail) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_ = fail;
  }
  void WaitEntered(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    changed_.wait(lock, [&] { return entered_ >= n; });
  }
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return blocks_.size();
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable changed_;
  bool open_ = true, fail_ = false;
  int entered_ = 0;
  std::map<uint64_t, std::vector<uint8_t>> blocks_;
};

TEST(BlockWriter, WritesEverythingOfferedAndCountsIt) {
  GatedStore store;
  BlockWriter writer(store, 8);
  for (uint64_t i = 1; i <= 20; ++i) {
    ASSERT_TRUE(writer.Offer(BlockHash{i, 0}, std::vector<uint8_t>(10 * i, 1)));
    ASSERT_TRUE(writer.Flush(-1));  // one at a time: the queue never fills
  }
  EXPECT_EQ(store.size(), 20u);
  EXPECT_EQ(writer.stats().written, 20);
  EXPECT_EQ(writer.stats().bytes_written, 10 * 210);
  EXPECT_EQ(writer.stats().dropped, 0);
  EXPECT_EQ(*store.Get(BlockHash{7, 0}), std::vector<uint8_t>(70, 1));
}

TEST(BlockWriter, AFullQueueDropsInsteadOfBlocking) {
  GatedStore store;
  store.SetOpen(false);
  BlockWriter writer(store, 3);
  ASSERT_TRUE(writer.Offer(BlockHash{1, 0}, {1}));
  store.WaitEntered(1);  // the writer holds block 1, blocked in the store
  for (uint64_t i = 2; i <= 4; ++i) ASSERT_TRUE(writer.Offer(BlockHash{i, 0}, {2}));
  EXPECT_FALSE(writer.Offer(BlockHash{5, 0}, {3})) << "the queue holds 3";
  EXPECT_FALSE(writer.Flush(0)) << "a bounded flush returns while the store is stuck";
  EXPECT_EQ(writer.stats().dropped, 1);
  store.SetOpen(true);
  ASSERT_TRUE(writer.Flush(-1));
  EXPECT_EQ(writer.stats().written, 4);
  EXPECT_FALSE(store.Contains(BlockHash{5, 0}));
}

TEST(BlockWriter, AFailingStoreTurnsTheTierOffOnce) {
  GatedStore store;
  store.SetOpen(false);
  store.SetFail(true);
  BlockWriter writer(store, 8);
  ASSERT_TRUE(writer.Offer(BlockHash{1, 0}, {1}));
  store.WaitEntered(1);
  for (uint64_t i = 2; i <= 6; ++i) ASSERT_TRUE(writer.Offer(BlockHash{i, 0}, {1}));
  store.SetOpen(true);
  writer.Flush(-1);
  const BlockWriterStats s = writer.stats();
  EXPECT_TRUE(s.failed);
  EXPECT_EQ(s.errors, BlockWriter::kFailuresToStop)
      << "failures in a row stop the tier: the rest queued is not tried";
  EXPECT_EQ(s.dropped, 6 - BlockWriter::kFailuresToStop);
  EXPECT_NE(writer.failure().find("No space left"), std::string::npos);
  store.SetFail(false);
  EXPECT_FALSE(writer.Offer(BlockHash{7, 0}, {1})) << "off until restart";
  EXPECT_EQ(writer.stats().dropped, 7 - BlockWriter::kFailuresToStop);
  EXPECT_EQ(store.size(), 0u);
}

TEST(BlockWriter, AFailureBetweenSuccessesCostsThatBlockOnly) {
  GatedStore store;
  BlockWriter writer(store, 8);
  for (uint64_t i = 1; i <= 9; ++i) {
    store.SetFail(i % 3 == 0);  // every third block fails: never kFailuresToStop in a row
    ASSERT_TRUE(writer.Offer(BlockHash{i, 0}, {1}));
    ASSERT_TRUE(writer.Flush(-1));
  }
  const BlockWriterStats s = writer.stats();
  EXPECT_FALSE(s.failed);
  EXPECT_EQ(s.errors, 3);
  EXPECT_EQ(s.written, 6);
  EXPECT_EQ(store.size(), 6u);
}

TEST(BlockWriter, DestructionFinishesTheWriteInProgressOnly) {
  // Flushed first, everything is written; destroyed at once, the write in progress completes
  // (no torn block) and what is queued may be dropped: the caller bounds the wait with Flush.
  GatedStore store;
  {
    BlockWriter writer(store, 16);
    for (uint64_t i = 1; i <= 10; ++i) ASSERT_TRUE(writer.Offer(BlockHash{i, 0}, {9}));
    ASSERT_TRUE(writer.Flush(-1));
  }
  EXPECT_EQ(store.size(), 10u);
  GatedStore gated;
  gated.SetOpen(false);
  {
    BlockWriter writer(gated, 16);
    for (uint64_t i = 1; i <= 3; ++i) ASSERT_TRUE(writer.Offer(BlockHash{i, 0}, {9}));
    gated.WaitEntered(1);  // block 1 is being written
    gated.SetOpen(true);
  }
  EXPECT_TRUE(gated.Contains(BlockHash{1, 0}));
  EXPECT_LE(gated.size(), 3u);
}

}  // namespace
}  // namespace kvs
