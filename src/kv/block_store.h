// Where KV blocks live below the RAM pool: a store keyed by the block's chain hash (here the disk
// tier's, of block files, kv/block_file.h; RedisBlockStore in kv/redis_block_store.h is the Redis
// tier's). Small on purpose: contains, put, get, erase. A store keeps bytes; checking them
// (checksum, identity) is the reader's job (DecodeBlockFile), so every tier is checked the same
// way.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/status.h"
#include "kv/kv_cache_manager.h"

namespace kvs {

// What a store counts about itself, for its tier's stats (engine/kv_tier.h); -1: it does not
// know, and the tier's own count stands (a shared remote store knows neither its size nor its
// block count: other replicas write it too).
struct BlockStoreCounters {
  bool up = true;              // false while a remote store cannot be reached
  int64_t errors = -1;         // failed commands or connections; -1: the tier's failed writes
  int64_t bytes_read = -1;     // bytes the store returned; -1: those the tier's loads checked
  int64_t bytes_written = -1;  // bytes the store took; -1: those the tier's writer wrote
  int64_t usage_bytes = -1;
  int64_t capacity_bytes = -1;
  int64_t blocks = -1;
  int64_t corrupt_at_open = 0;  // entries found unusable when the store opened
};

// One block read back from a store.
struct StoredBlock {
  enum class State {
    kFound,        // bytes hold what is stored under the hash (still to be checked)
    kAbsent,       // nothing is stored under it (never was, evicted, expired)
    kUnreadable,   // something is, but not a block file's bytes (a directory, a wrong type)
    kUnavailable,  // the store could not be asked (unreachable, timed out): a miss, not damage
  };
  State state = State::kAbsent;
  std::vector<uint8_t> bytes;
  std::string error;  // why, for kUnreadable and kUnavailable
};

class BlockStore {
 public:
  virtual ~BlockStore() = default;
  virtual std::string_view name() const = 0;
  // Whether the block is stored. Exact for a store whose index is local (KnowsContents); for a
  // remote store, only what this process knows (it wrote or read the block): a hint that saves
  // a rewrite, never a reason to skip a lookup.
  virtual bool Contains(const BlockHash& hash) const = 0;
  virtual bool KnowsContents() const { return true; }
  // False while the store is known to be unreachable (a remote store between reconnect tries):
  // callers skip lookups rather than hold pool blocks for them.
  virtual bool Available() const { return true; }
  // Whether a remote store comes back after refusing writes (a server that was down): its
  // writer keeps offering instead of turning the tier off. A local store that refuses writes
  // is full or gone for good.
  virtual bool Recovers() const { return false; }
  // A remote store answers within this many ms or fails: a load from it may wait that long
  // (or as long as computing its tokens would take). 0: a local store, no deadline.
  virtual int64_t timeout_ms() const { return 0; }
  // A block the store may neither write nor load in this run (something else holds its name).
  virtual bool Unusable(const BlockHash&) const { return false; }
  virtual BlockStoreCounters counters() const { return {}; }
  // Stores a block file's bytes under hash (replacing what was there).
  virtual Status Put(const BlockHash& hash, std::span<const uint8_t> file) = 0;
  // The stored bytes; an error when absent or unreadable.
  virtual Expected<std::vector<uint8_t>> Get(const BlockHash& hash) = 0;
  virtual void Erase(const BlockHash& hash) = 0;
  // Several blocks at once (a remote store sends them as one pipelined batch). The default asks
  // Get for each.
  virtual std::vector<StoredBlock> GetMany(std::span<const BlockHash> hashes);
};

// 32 hex digits (hi then lo), the name of a block's file: "<hex>.kvb".
std::string BlockHashHex(const BlockHash& hash);
bool ParseBlockHashHex(std::string_view hex, BlockHash* hash);

// A directory of block files, one per hash, LRU by size within capacity_bytes. Open() rebuilds
// the index from the directory (a restart finds what was stored) and removes temporary files a
// crash left. Thread-safe: the engine looks blocks up while an I/O thread writes them.
class DiskBlockStore final : public BlockStore {
 public:
  // progress(files_seen): called every 4,096 files while Open scans a large store.
  static Expected<std::unique_ptr<DiskBlockStore>> Open(
      const std::string& dir, uint64_t capacity_bytes,
      const std::function<void(int64_t)>& progress = nullptr);

  std::string_view name() const override { return "disk"; }
  bool Contains(const BlockHash& hash) const override;
  Status Put(const BlockHash& hash, std::span<const uint8_t> file) override;
  Expected<std::vector<uint8_t>> Get(const BlockHash& hash) override;
  void Erase(const BlockHash& hash) override;

  // Pinned blocks are never evicted by LRU (KV documents); they still count against capacity.
  void Pin(const BlockHash& hash, bool pinned);
  uint64_t usage_bytes() const;
  int64_t num_blocks() const;
  const std::string& dir() const { return dir_; }
  uint64_t capacity_bytes() const;
  // A new capacity (blocks past it are evicted now, least recently used first, pins kept).
  void set_capacity(uint64_t bytes);
  // Entries under a block's name that Open found were not regular files (directories, links).
  int64_t rejected_at_open() const { return rejected_at_open_; }
  // A block whose name something else holds that the store may not remove (a directory with
  // contents): never written nor loaded in this run, so that it costs that block only.
  bool Unusable(const BlockHash& hash) const override;
  BlockStoreCounters counters() const override;

 private:
  struct Entry {
    uint64_t bytes = 0;
    bool pinned = false;
    std::list<BlockHash>::iterator lru;  // position in lru_ (front: least recently used)
  };
  DiskBlockStore(std::string dir, uint64_t capacity) : dir_(std::move(dir)), capacity_(capacity) {}
  std::string PathOf(const BlockHash& hash) const;
  void Touch(Entry& e, const BlockHash& hash);
  void EraseLocked(const BlockHash& hash);
  // Removes least recently used unpinned blocks until `incoming` more bytes fit.
  void MakeRoomLocked(uint64_t incoming);

  const std::string dir_;
  uint64_t capacity_;  // guarded by mu_
  mutable std::mutex mu_;
  std::unordered_map<BlockHash, Entry, BlockHashHasher> index_;
  std::list<BlockHash> lru_;
  uint64_t usage_ = 0;
  int64_t rejected_at_open_ = 0;
  std::unordered_set<BlockHash, BlockHashHasher> unusable_;
};

}  // namespace kvs
