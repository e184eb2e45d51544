// Writes block files to a BlockStore on a thread of its own, so that the engine's steps never
// wait on a disk (issue #20): the engine hands over encoded blocks and returns at once. The queue
// is bounded; a block offered while it is full is dropped and counted (it is computed again if
// it is ever needed, nothing is lost but the chance to reuse it). When the store fails (a full
// disk, a read-only or vanished directory) the writer stops writing, says so once, and the tier
// is off until restart: serving goes on without it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kv/block_store.h"

namespace kvs {

struct BlockWriterStats {
  int64_t written = 0;        // blocks stored
  int64_t bytes_written = 0;  // their file bytes
  int64_t dropped = 0;        // offered while the queue was full, or after the tier failed
  int64_t errors = 0;         // writes the store refused
  bool failed = false;        // the tier is off (the first error's message in failure())
};

class BlockWriter {
 public:
  // max_queued: blocks waiting at most (their bytes are held in memory until written).
  BlockWriter(BlockStore& store, int32_t max_queued);
  ~BlockWriter();  // Flush(no limit), then stops the thread

  // Queues a block's file bytes under hash; false (and counted) when the queue is full or the
  // tier has failed. Never blocks on I/O.
  bool Offer(const BlockHash& hash, std::vector<uint8_t> file);
  // Waits until everything queued is written or timeout_ms passed (SIGTERM's bounded flush);
  // true when the queue emptied.
  bool Flush(int64_t timeout_ms);
  BlockWriterStats stats() const;
  std::string failure() const;

 private:
  struct Job {
    BlockHash hash;
    std::vector<uint8_t> file;
  };
  void Loop();

  BlockStore& store_;
  const size_t max_queued_;
  mutable std::mutex mu_;
  std::condition_variable work_, idle_;
  std::deque<Job> queue_;
  bool busy_ = false;  // a job is being written
  bool stop_ = false;
  BlockWriterStats stats_;
  std::string failure_;
  std::thread thread_;
};

}  // namespace kvs
