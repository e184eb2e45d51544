#include "kv/block_loader.h"

#include <algorithm>
#include <chrono>

namespace kvs {

BlockLoader::BlockLoader(BlockStore& store, BlockIdentity identity, WriteBlockFn write_block,
                         std::shared_ptr<const KvBlockCodec> transform)
    : store_(store),
      identity_(identity),
      transform_(std::move(transform)),
      write_block_(std::move(write_block)) {
  thread_ = std::thread([this] { Loop(); });
}

BlockLoader::~BlockLoader() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_.notify_all();
  thread_.join();
}

void BlockLoader::Submit(LoadJob job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(job));
    ++outstanding_;
  }
  work_.notify_one();
}

std::vector<LoadResult> BlockLoader::TakeDone() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<LoadResult> out;
  out.swap(done_);
  outstanding_ -= static_cast<int32_t>(out.size());
  return out;
}

bool BlockLoader::WaitDone(int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  return done_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                           [&] { return !done_.empty(); });
}

int32_t BlockLoader::outstanding() const {
  std::lock_guard<std::mutex> lock(mu_);
  return outstanding_;
}

bool BlockLoader::Check(const LoadJob& job, size_t i, StoredBlock& stored,
                        std::vector<uint8_t>* payload, bool* missing, int64_t* bytes_read,
                        std::string* why) {
  const BlockHash& hash = job.hashes[i];
  const size_t block_size = job.tokens.size() / job.blocks.size();
  *missing = false;
  switch (stored.state) {
    case StoredBlock::State::kFound:
      break;
    case StoredBlock::State::kAbsent:
      *missing = true;
      *why = std::string("not in the ") + std::string(store_.name()) + " store";
      // A local index may still name a file that vanished: forget it.
      if (store_.KnowsContents()) store_.Erase(hash);
      return false;
    case StoredBlock::State::kUnavailable:
      // The store could not be asked: a miss, and nothing to erase.
      *missing = true;
      *why = stored.error;
      return false;
    case StoredBlock::State::kUnreadable:
      *why = stored.error;
      store_.Erase(hash);
      return false;
  }
  *bytes_read += static_cast<int64_t>(stored.bytes.size());
  bool other_codec = false;
  auto block = DecodeBlockFile(stored.bytes, identity_, hash, transform_.get(), &other_codec);
  if (other_codec) {
    // Sound, but written with other codec settings: a miss, not damage. Erased all the same, so
    // that the recompute stores it again in this tier's codec (a store keeps one file a hash).
    *missing = true;
    store_.Erase(hash);
    *why = block.status().message();
    other_codec_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  Status check = block.ok() ? Status::Ok() : block.status();
  if (check.ok()) {
    const BlockHash parent = i == 0 ? job.first_parent : job.hashes[i - 1];
    const std::span<const int32_t> want(job.tokens.data() + i * block_size, block_size);
    if (!(block->header.parent == parent)) {
      check = Status::Error("block file: another parent block than the prompt's");
    } else if (!std::equal(want.begin(), want.end(), block->header.tokens.begin(),
                           block->header.tokens.end())) {
      check = Status::Error("block file: other token ids than the prompt's");
    }
  }
  if (!check.ok()) {
    *why = check.message();
    store_.Erase(hash);  // never loaded, and never looked up again
    return false;
  }
  *payload = std::move(block->payload);
  return true;
}

LoadResult BlockLoader::Run(const LoadJob& job) {
  LoadResult r;
  r.ticket = job.ticket;
  std::vector<uint8_t> payload;
  bool missing = false;
  std::string why;
  // Blocks are asked for kBatch at a time (one round trip to a remote store), in chain order.
  std::vector<StoredBlock> batch;
  size_t batch_start = 0;
  const auto fetch = [&](size_t i) -> StoredBlock& {
    if (i >= batch_start + batch.size()) {
      batch_start = i;
      const size_t n = std::min(kBatch, job.hashes.size() - i);
      batch = store_.GetMany(std::span<const BlockHash>(job.hashes.data() + i, n));
    }
    return batch[i - batch_start];
  };
  size_t i = 0;
  for (; i < job.blocks.size(); ++i) {
    if (i >= batch_start + batch.size() && std::chrono::steady_clock::now() >= job.deadline) {
      why = "the load's deadline passed (the store answers slower than computing would)";
      missing = true;
      r.deadline_passed = true;
      break;
    }
    if (!Check(job, i, fetch(i), &payload, &missing, &r.bytes_read, &why)) break;
    if (Status st = write_block_(job.blocks[i], payload); !st.ok()) {
      why = st.message();
      missing = false;
      break;
    }
    ++r.n_loaded;
  }
  if (i == job.blocks.size()) return r;
  r.error = why;
  (missing ? r.missing : r.corrupt) = 1;
  // A remote store is not asked further than the first miss (the chain ends there). A local
  // one is: bad files among the rest are found now, so that the recompute rewrites them (a
  // good file stays and serves the next time).
  if (!store_.KnowsContents()) return r;
  for (++i; i < job.blocks.size(); ++i) {
    if (!Check(job, i, fetch(i), &payload, &missing, &r.bytes_read, &why) && !missing) {
      ++r.corrupt;
    }
  }
  return r;
}

void BlockLoader::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    work_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) return;
    LoadJob job = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    const auto t0 = std::chrono::steady_clock::now();
    LoadResult result = Run(job);
    result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    lock.lock();
    done_.push_back(std::move(result));
    done_cv_.notify_all();
  }
}

}  // namespace kvs
