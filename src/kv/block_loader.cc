#include "kv/block_loader.h"

#include <chrono>

namespace kvs {

BlockLoader::BlockLoader(BlockStore& store, BlockIdentity identity, WriteBlockFn write_block)
    : store_(store), identity_(identity), write_block_(std::move(write_block)) {
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

bool BlockLoader::Check(const LoadJob& job, size_t i, std::vector<uint8_t>* payload, bool* missing,
                        int64_t* bytes_read, std::string* why) {
  const BlockHash& hash = job.hashes[i];
  const size_t block_size = job.tokens.size() / job.blocks.size();
  *missing = false;
  auto bytes = store_.Get(hash);
  if (!bytes.ok()) {
    // Gone since the lookup (evicted by LRU, removed by hand, the directory vanished): a miss.
    // Anything else unreadable under the block's name (a directory, a FIFO, a link) is corrupt.
    *why = bytes.error();
    *missing = why->find("not in the disk store") != std::string::npos ||
               why->find("No such file") != std::string::npos;
    store_.Erase(hash);
    return false;
  }
  *bytes_read += static_cast<int64_t>(bytes->size());
  auto block = DecodeBlockFile(*bytes, identity_, hash);
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
  size_t i = 0;
  for (; i < job.blocks.size(); ++i) {
    if (!Check(job, i, &payload, &missing, &r.bytes_read, &why)) break;
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
  // The rest is recomputed; bad files among it are found now, so that the recompute rewrites
  // them (a good file stays and serves the next time).
  for (++i; i < job.blocks.size(); ++i) {
    if (!Check(job, i, &payload, &missing, &r.bytes_read, &why) && !missing) ++r.corrupt;
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
