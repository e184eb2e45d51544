// The tiers' loader (kv/block_loader.h): a job loads the leading run of good blocks, and a job's
// deadline bounds how long a slow store holds a sequence: no batch is asked for after it, the
// blocks already read are kept, and a job that waited past its deadline behind another loads
// nothing (issue #22: a Redis that answers just under its timeout must not make loads slower
// than computing). The slow store waits on the clock itself, not on a sleep of a guessed length.
#include "kv/block_loader.h"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>

namespace kvs::block_loader_test {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int32_t kBlockSize = 4;

BlockIdentity Identity() {
  BlockIdentity id;
  id.model = {1, 2};
  id.kv_format = {3, 4};
  id.block_size = kBlockSize;
  id.n_layer = 1;
  id.n_head_kv = 1;
  id.head_dim_k = id.head_dim_v = 4;
  return id;
}

// A remote-like store (KnowsContents false) whose GetMany returns only once `slow_until` has
// passed: a store that answers just inside its timeout.
class SlowStore final : public BlockStore {
 public:
  std::string_view name() const override { return "slow"; }
  bool KnowsContents() const override { return false; }
  bool Contains(const BlockHash& h) const override { return blocks_.contains(h.lo); }
  Status Put(const BlockHash& h, std::span<const uint8_t> file) override {
    blocks_[h.lo] = std::vector<uint8_t>(file.begin(), file.end());
    return Status::Ok();
  }
  Expected<std::vector<uint8_t>> Get(const BlockHash& h) override {
    std::unique_lock<std::mutex> lock(mu_);
    ++gets_;
    cv_.wait_until(lock, slow_until_, [] { return false; });
    auto it = blocks_.find(h.lo);
    if (it == blocks_.end()) return Status::Error("absent");
    return it->second;
  }
  std::vector<StoredBlock> GetMany(std::span<const BlockHash> hashes) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      ++batches_;
      cv_.wait_until(lock, slow_until_, [] { return false; });
    }
    std::vector<StoredBlock> out(hashes.size());
    for (size_t i = 0; i < hashes.size(); ++i) {
      auto it = blocks_.find(hashes[i].lo);
      if (it == blocks_.end()) continue;
      out[i].state = StoredBlock::State::kFound;
      out[i].bytes = it->second;
    }
    return out;
  }
  void Erase(const BlockHash& h) override { blocks_.erase(h.lo); }
  void SlowUntil(Clock::time_point t) { slow_until_ = t; }
  int batches() {
    std::lock_guard<std::mutex> lock(mu_);
    return batches_;
  }

 private:
  std::map<uint64_t, std::vector<uint8_t>> blocks_;  // filled before the loader starts
  std::mutex mu_;
  std::condition_variable cv_;
  Clock::time_point slow_until_{};
  int batches_ = 0, gets_ = 0;
};

// A job of n blocks of a chain, every block stored in `store`.
LoadJob StoredChain(SlowStore& store, int n, uint64_t ticket) {
  LoadJob job;
  job.ticket = ticket;
  BlockHash parent{};
  for (int i = 0; i < n; ++i) {
    BlockFileHeader h;
    h.identity = Identity();
    h.hash = BlockHash{ticket * 1000 + static_cast<uint64_t>(i) + 1, 7};
    h.parent = parent;
    for (int32_t t = 0; t < kBlockSize; ++t) h.tokens.push_back(i * kBlockSize + t);
    const std::vector<uint8_t> payload(32, static_cast<uint8_t>(i));
    auto file = EncodeBlockFile(h, payload);
    EXPECT_TRUE(file.ok());
    EXPECT_TRUE(store.Put(h.hash, *file).ok());
    job.blocks.push_back(BlockId{i});
    job.hashes.push_back(h.hash);
    job.tokens.insert(job.tokens.end(), h.tokens.begin(), h.tokens.end());
    parent = h.hash;
  }
  return job;
}

LoadResult WaitFor(BlockLoader& loader) {
  while (true) {
    std::vector<LoadResult> done = loader.TakeDone();
    if (!done.empty()) return done.front();
    loader.WaitDone(1000);
  }
}

TEST(BlockLoader, LoadsTheWholeChainBeforeItsDeadline) {
  SlowStore store;
  LoadJob job = StoredChain(store, 40, 1);
  int written = 0;
  BlockLoader loader(store, Identity(), [&](BlockId, std::span<const uint8_t>) {
    ++written;
    return Status::Ok();
  });
  loader.Submit(std::move(job));
  const LoadResult r = WaitFor(loader);
  EXPECT_EQ(r.n_loaded, 40);
  EXPECT_FALSE(r.deadline_passed);
  EXPECT_EQ(written, 40);
  EXPECT_EQ(store.batches(), 3);  // 16 + 16 + 8
}

TEST(BlockLoader, ASlowStoreKeepsTheBlocksReadBeforeTheDeadlineAndAsksNoMore) {
  SlowStore store;
  LoadJob job = StoredChain(store, 40, 1);
  job.deadline = Clock::now() + std::chrono::milliseconds(100);
  store.SlowUntil(job.deadline + std::chrono::milliseconds(1));  // the first batch ends past it
  BlockLoader loader(store, Identity(),
                     [](BlockId, std::span<const uint8_t>) { return Status::Ok(); });
  loader.Submit(std::move(job));
  const LoadResult r = WaitFor(loader);
  EXPECT_EQ(r.n_loaded, 16);  // the one batch that was asked for
  EXPECT_TRUE(r.deadline_passed);
  EXPECT_EQ(r.missing, 1);
  EXPECT_EQ(r.corrupt, 0);
  EXPECT_EQ(store.batches(), 1);
  EXPECT_NE(r.error.find("deadline"), std::string::npos) << r.error;
}

TEST(BlockLoader, AJobQueuedPastItsDeadlineLoadsNothingAndAsksNothing) {
  SlowStore store;
  LoadJob first = StoredChain(store, 8, 1);
  LoadJob second = StoredChain(store, 8, 2);
  const auto now = Clock::now();
  second.deadline = now + std::chrono::milliseconds(50);
  store.SlowUntil(second.deadline + std::chrono::milliseconds(1));  // the first job outlasts it
  BlockLoader loader(store, Identity(),
                     [](BlockId, std::span<const uint8_t>) { return Status::Ok(); });
  loader.Submit(std::move(first));
  loader.Submit(std::move(second));
  std::vector<LoadResult> results;
  while (results.size() < 2) {
    for (LoadResult& r : loader.TakeDone()) results.push_back(std::move(r));
    if (results.size() < 2) loader.WaitDone(1000);
  }
  EXPECT_EQ(results[0].ticket, 1u);
  EXPECT_EQ(results[0].n_loaded, 8);  // no deadline: the slow answer is still used
  EXPECT_EQ(results[1].ticket, 2u);
  EXPECT_EQ(results[1].n_loaded, 0);
  EXPECT_TRUE(results[1].deadline_passed);
  EXPECT_EQ(store.batches(), 1);  // the second job never asked
}

}  // namespace
}  // namespace kvs::block_loader_test
