// Writes block files to a BlockStore on a thread of its own, so that the engine's steps never
// wait on a disk (issue #20): the engine hands over encoded blocks and returns at once. The queue
// is bounded; a block offered while it is full is dropped and counted (it is computed again if
// it is ever needed, nothing is lost but the chance to reuse it). When the store fails (a full
// disk, a read-only or vanished directory: kFailuresToStop writes in a row refused) the writer
// stops writing, says so once, and the tier is off until restart: serving goes on without it.
// A failure between successes (one block's name taken by a directory, a temporary file removed
// by hand) costs that block only.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "kv/block_file.h"
#include "kv/block_store.h"

namespace kvs {

struct BlockWriterStats {
  int64_t written = 0;        // blocks stored
  int64_t bytes_written = 0;  // their file bytes
  int64_t payload_bytes = 0;  // the KV bytes they hold (bytes_written / payload_bytes: the
                              // codec's ratio, headers included)
  int64_t dropped = 0;        // offered while the queue was full, or after the tier failed
  int64_t errors = 0;         // writes the store refused
  bool failed = false;        // the tier is off (the first error's message in failure())
};

class BlockWriter {
 public:
  static constexpr int32_t kFailuresToStop = 4;
  // max_queued: blocks waiting at most (their bytes are held in memory until written).
  // failures_to_stop: refused writes in a row that turn the writer off (a disk); 0: never (a
  // remote store that is down now and back later: its writes fail fast meanwhile, counted).
  // transform: encodes blocks offered with BlockCodec::kTransform (null: none are).
  BlockWriter(BlockStore& store, int32_t max_queued, int32_t failures_to_stop = kFailuresToStop,
              std::shared_ptr<const KvBlockCodec> transform = nullptr);
  // Finishes the write in progress, drops what is queued (Flush first to keep it: its bound is
  // the caller's to choose) and stops the thread.
  ~BlockWriter();

  // Queues a block's file bytes under hash; false (and counted) when the queue is full or the
  // tier has failed. Never blocks on I/O.
  bool Offer(const BlockHash& hash, std::vector<uint8_t> file);
  // Queues a block to be encoded (EncodeBlockFile at zstd_level, on the writer's thread: the
  // caller pays only for the copy of its bytes) and written under header.hash. As Offer.
  bool OfferBlock(BlockFileHeader header, std::vector<uint8_t> payload, int zstd_level = 3);
  // Whether a block is queued or being written (so that nobody offers it twice).
  bool Pending(const BlockHash& hash) const;
  // Waits until everything queued is written or timeout_ms passed (SIGTERM's bounded flush);
  // true when the queue emptied.
  bool Flush(int64_t timeout_ms);
  BlockWriterStats stats() const;
  std::string failure() const;
  // The message of the latest write the store refused (empty: none was).
  std::string last_error() const;

 private:
  struct Job {
    BlockHash hash;
    std::vector<uint8_t> bytes;  // the file, or the payload to encode with *header
    std::optional<BlockFileHeader> header;
    int zstd_level = 3;
  };
  bool Enqueue(Job job);
  void Loop();

  BlockStore& store_;
  const std::shared_ptr<const KvBlockCodec> transform_;
  const size_t max_queued_;
  const int32_t failures_to_stop_;
  mutable std::mutex mu_;
  std::condition_variable work_, idle_;
  std::deque<Job> queue_;
  std::unordered_set<BlockHash, BlockHashHasher> pending_;  // queued or being written
  int32_t failures_in_a_row_ = 0;
  bool busy_ = false;  // a job is being written
  bool stop_ = false;
  BlockWriterStats stats_;
  std::string failure_;
  std::string last_error_;
  std::thread thread_;
};

}  // namespace kvs
