// Reads blocks back from a BlockStore on a thread of its own (issue #20's disk tier): a load job
// names pool blocks held for it and the chain hashes, parents and tokens they should hold; the
// loader reads each file, checks it (DecodeBlockFile: checksum, identity, hash; then the parent
// and the token ids) and writes the payload into its pool block. The first block that fails
// ends the job: the blocks before it are loaded, the rest are recomputed (and still checked, so
// that every bad file of the chain is found at once and rewritten as it is recomputed). A block
// that fails a check is counted as corrupt and erased from the store, never loaded. The engine
// collects
// finished jobs between steps, so no step waits on a disk.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/ids.h"
#include "kv/block_file.h"
#include "kv/block_store.h"

namespace kvs {

struct LoadJob {
  uint64_t ticket = 0;            // the caller's
  std::vector<BlockId> blocks;    // [n] pool blocks to fill, held for the job
  std::vector<BlockHash> hashes;  // [n] their chain hashes
  BlockHash first_parent;         // the chain hash before hashes[0] (zero at the prompt's start)
  std::vector<int32_t> tokens;    // [n][block_size] the token ids each block must hold
  // No batch is asked for after this time (a store slower than computing the tokens, or a job
  // that waited behind a slow one): the blocks read so far are kept, the rest recomputed.
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
};

struct LoadResult {
  uint64_t ticket = 0;
  int32_t n_loaded = 0;    // blocks [0, n_loaded) hold their hashes' KV
  int64_t bytes_read = 0;  // file bytes read
  int32_t corrupt = 0;     // blocks that failed a check (the one that ended the job, and after)
  int32_t missing = 0;     // 0 or 1: the block that ended the job was not stored (or the store
                           // could not be asked)
  bool deadline_passed = false;  // the job ended at its deadline
  std::string error;             // why the job ended early
  double seconds = 0;            // spent reading, checking and copying
};

class BlockLoader {
 public:
  // write_block(block, payload): copies a checked payload into the pool (KvStorage::WriteBlock).
  using WriteBlockFn = std::function<Status(BlockId, std::span<const uint8_t>)>;
  // transform: decodes transform-coded blocks (null: they are misses).
  BlockLoader(BlockStore& store, BlockIdentity identity, WriteBlockFn write_block,
              std::shared_ptr<const KvBlockCodec> transform = nullptr);
  ~BlockLoader();  // drops jobs not started, finishes the one running, stops the thread

  void Submit(LoadJob job);
  // Finished jobs, oldest first.
  std::vector<LoadResult> TakeDone();
  // Waits until a job is done or timeout_ms passed; true when one is.
  bool WaitDone(int64_t timeout_ms);
  // Jobs submitted and not yet taken by TakeDone.
  int32_t outstanding() const;
  // Blocks found written with other codec settings (missed, not corrupt), so far.
  int64_t other_codec_blocks() const { return other_codec_.load(std::memory_order_relaxed); }

 private:
  LoadResult Run(const LoadJob& job);
  // Checks block i of job as read back (stored); its payload in *payload. false: missing (absent
  // or the store unavailable, or written with other codec settings: erased too), or corrupt
  // (then erased from the store), with *why.
  bool Check(const LoadJob& job, size_t i, StoredBlock& stored, std::vector<uint8_t>* payload,
             bool* missing, int64_t* bytes_read, std::string* why);
  static constexpr size_t kBatch = 16;  // blocks asked for at once
  void Loop();

  BlockStore& store_;
  const BlockIdentity identity_;
  const std::shared_ptr<const KvBlockCodec> transform_;
  WriteBlockFn write_block_;
  mutable std::mutex mu_;
  std::condition_variable work_, done_cv_;
  std::deque<LoadJob> queue_;
  std::vector<LoadResult> done_;
  int32_t outstanding_ = 0;
  std::atomic<int64_t> other_codec_{0};
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace kvs
