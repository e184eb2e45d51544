#include "kv/block_writer.h"

#include <chrono>

#include "core/log.h"

namespace kvs {

BlockWriter::BlockWriter(BlockStore& store, int32_t max_queued, int32_t failures_to_stop,
                         std::shared_ptr<const KvBlockCodec> transform)
    : store_(store),
      transform_(std::move(transform)),
      max_queued_(static_cast<size_t>(std::max(max_queued, 1))),
      failures_to_stop_(failures_to_stop) {
  thread_ = std::thread([this] { Loop(); });
}

BlockWriter::~BlockWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    stats_.dropped += static_cast<int64_t>(queue_.size());
    queue_.clear();
    pending_.clear();
  }
  work_.notify_all();
  thread_.join();
}

bool BlockWriter::Offer(const BlockHash& hash, std::vector<uint8_t> file) {
  return Enqueue(Job{hash, std::move(file), std::nullopt, 0});
}

bool BlockWriter::OfferBlock(BlockFileHeader header, std::vector<uint8_t> payload, int zstd_level) {
  const BlockHash hash = header.hash;
  return Enqueue(Job{hash, std::move(payload), std::move(header), zstd_level});
}

bool BlockWriter::Enqueue(Job job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stats_.failed || queue_.size() >= max_queued_) {
      ++stats_.dropped;
      return false;
    }
    pending_.insert(job.hash);
    queue_.push_back(std::move(job));
  }
  work_.notify_one();
  return true;
}

bool BlockWriter::Pending(const BlockHash& hash) const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_.contains(hash);
}

bool BlockWriter::Flush(int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  auto drained = [&] { return (queue_.empty() && !busy_) || stats_.failed; };
  if (timeout_ms < 0) {
    idle_.wait(lock, drained);
  } else {
    idle_.wait_for(lock, std::chrono::milliseconds(timeout_ms), drained);
  }
  return queue_.empty() && !busy_;
}

BlockWriterStats BlockWriter::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

std::string BlockWriter::last_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_error_;
}

std::string BlockWriter::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

void BlockWriter::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    work_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_, nothing left
    Job job = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    const int64_t payload_bytes = static_cast<int64_t>(job.bytes.size());
    Status st = Status::Ok();
    if (job.header) {
      auto file = EncodeBlockFile(*job.header, job.bytes, job.zstd_level, transform_.get());
      if (file.ok()) {
        job.bytes = std::move(*file);
      } else {
        st = file.status();
      }
    }
    if (st.ok()) st = store_.Put(job.hash, job.bytes);
    lock.lock();
    busy_ = false;
    pending_.erase(job.hash);
    if (st.ok()) {
      failures_in_a_row_ = 0;
      ++stats_.written;
      stats_.bytes_written += static_cast<int64_t>(job.bytes.size());
      stats_.payload_bytes += job.header ? payload_bytes : static_cast<int64_t>(job.bytes.size());
    } else {
      ++stats_.errors;
      if (failure_.empty()) failure_ = st.message();
      last_error_ = st.message();
      if (failures_to_stop_ == 0) {
        // A store that comes back (Redis): it reports its own state changes; no line per block.
      } else if (++failures_in_a_row_ < failures_to_stop_) {
        KVS_LOG_WARN("kv %.*s: a block was not written: %s", static_cast<int>(store_.name().size()),
                     store_.name().data(), st.message().c_str());
      } else if (!stats_.failed) {
        // One line, once: the tier is off from here on; what is queued is dropped.
        stats_.failed = true;
        stats_.dropped += static_cast<int64_t>(queue_.size());
        queue_.clear();
        pending_.clear();
        KVS_LOG_WARN("kv %.*s tier off: %s (serving continues without it)",
                     static_cast<int>(store_.name().size()), store_.name().data(),
                     failure_.c_str());
      }
    }
    if (queue_.empty()) idle_.notify_all();
  }
}

}  // namespace kvs
