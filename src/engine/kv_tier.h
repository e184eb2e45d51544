// The tiers under the RAM prefix cache, the engine's seam for them (vLLM's KV connector): the
// disk (issue #20) and a Redis server shared by replicas (issue #22), one KvTier each over its
// BlockStore. Full blocks the prefix cache indexes go to the store keyed by their chain hash, and
// a prompt whose prefix chain continues past the RAM pool into a store has those blocks loaded
// into fresh pool blocks instead of recomputed. Tiers are asked in order (RAM, disk, Redis): a
// tier probes a waiting sequence once the tiers above it have loaded what they hold, and again
// at every step while the pool has no free block to load into.
//
// A store that knows its contents (the disk's index) is asked which blocks it holds before any
// pool block is taken. A remote store (Redis) would cost the step a round trip to ask, so its
// tier holds pool blocks for the whole rest of the prefix (as many as are free above the
// watermark) and its loader asks for them in pipelined batches, keeping the leading run that
// was found; the rest go back to the pool when the load ends. While the store is unreachable
// nothing is held or asked.
//
// When blocks are written (--kv-disk-policy):
//   write-through (default): as soon as a block is committed (full, computed, hashed). A crash
//     (kill -9) loses at most what was queued; the cost is the copy of the block's bytes on
//     the step path (encoding and the write are on the writer's thread) and disk bandwidth for
//     blocks that are never reused.
//   write-back: when the block leaves the RAM pool (LRU reuse), or at a clean shutdown. Less
//     written, but a crash loses every block still only in RAM.
// Whatever the policy, Flush (SIGTERM) writes every indexed block not yet on disk, bounded in
// time. Writes and loads run on their own threads with bounded queues: a block offered while
// the write queue is full is dropped and counted (recomputed if it is ever needed); a load
// holds its pool blocks until it ends and the sequence waits for it, never a running decode.
// The scheduler admits a loading sequence once its load ended, with the loaded blocks as a
// cached prefix: a load takes no token budget, so it is always cheaper than prefill.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "engine/request.h"
#include "engine/transform_codec.h"
#include "kv/block_file.h"
#include "kv/block_loader.h"
#include "kv/block_store.h"
#include "kv/block_writer.h"
#include "kv/kv_cache_manager.h"
#include "kv/kv_storage.h"

namespace kvs {

enum class KvDiskPolicy { kWriteThrough, kWriteBack };

Expected<KvDiskPolicy> ParseKvDiskPolicy(const std::string& name);
// raw, zstd, or tc:N[,sink=S] (kTransform; its options from ParseTransformCodec).
Expected<BlockCodec> ParseBlockCodec(const std::string& name);

inline constexpr uint64_t kDefaultKvDiskBytes = uint64_t{20} << 30;

struct KvTierConfig {
  std::string dir;              // --kv-disk
  uint64_t capacity_bytes = 0;  // --kv-disk-size; 0: 20G or the free space, whichever is less
  KvDiskPolicy policy = KvDiskPolicy::kWriteThrough;
  BlockCodec codec = BlockCodec::kRaw;
  int zstd_level = 3;
  // codec kTransform (--kv-disk-codec tc:N): its options, and the codec the builder fitted.
  TransformCodecOptions transform_options;
  std::shared_ptr<const KvBlockCodec> transform;
  int64_t write_queue_bytes = int64_t{256} << 20;  // KV bytes waiting to be written, at most
  int64_t flush_timeout_ms = 20000;                // Flush's bound (SIGTERM)
};

// The shared Redis tier (--kv-redis URL ...; no URL: none).
struct KvRedisConfig {
  std::string url;            // --kv-redis redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]
  std::string password_file;  // --kv-redis-password-file (its first line; overrides the URL's)
  int64_t ttl_seconds = 0;    // --kv-redis-ttl; 0: no expiry (Redis's maxmemory policy evicts)
  int64_t timeout_ms = 500;   // --kv-redis-timeout-ms: connect and every command
  std::string key_namespace = "kvserve";
  int zstd_level = 1;  // values are zstd-compressed block files (fast level: the wire is loopback
                       // or a LAN, where the CPU is the dearer resource)
  // --kv-redis-codec tc:N: values transform-coded instead (the builder fits the codec).
  std::optional<TransformCodecOptions> transform_options;
  std::shared_ptr<const KvBlockCodec> transform;
  int64_t write_queue_bytes = int64_t{256} << 20;
};

struct KvTierStats {
  int64_t hits = 0;           // blocks loaded from the store
  int64_t misses = 0;         // blocks past the RAM prefix that the store did not have either
  int64_t corrupt = 0;        // blocks that failed a check (never loaded; removed)
  int64_t bytes_read = 0;     // bytes read by loads (a remote store: every value it returned)
  int64_t bytes_written = 0;  // bytes written
  int64_t payload_bytes_written = 0;  // the KV bytes in them (ratio: the codec's)
  int64_t blocks_written = 0;
  int64_t dropped = 0;       // blocks not written: the queue was full or the tier had failed
  int64_t write_errors = 0;  // writes the store refused (Redis down: they fail fast)
  int64_t errors = 0;        // the store's failed commands (a local one: its refused writes)
  // -1 where the store does not know (a shared remote one).
  int64_t usage_bytes = -1;
  int64_t capacity_bytes = -1;
  int64_t blocks_stored = -1;
  int64_t loaded_tokens = 0;
  int64_t load_deadlines = 0;  // loads ended at their deadline (a store slower than computing)
  double load_seconds = 0;     // the loader's busy time (bytes_read / load_seconds: its read rate)
  bool failed = false;  // the tier turned itself off (a full, read-only or vanished directory)
  bool up = true;       // writing, and (a remote store) reachable at the last attempt
};

class KvTier {
 public:
  // A tier over store (its kind's opener in engine/kv_tier_kinds.cc made it); identity: what
  // the pool's blocks depend on.
  static std::unique_ptr<KvTier> Make(const KvTierConfig& config, const BlockIdentity& identity,
                                      KvStorage& storage, std::unique_ptr<BlockStore> store);
  ~KvTier();

  // The tier's label ("disk", "redis"): its store's name, the `tier` label of its metrics and
  // the key of its tokens in a request's usage.
  std::string_view name() const { return store_->name(); }
  // Its place in the engine's list (the order tiers are asked in); set when attached.
  int index() const { return index_; }
  void set_index(int index) { index_ = index; }
  const KvTierConfig& config() const { return config_; }
  // The disk tier's store (KV documents pin its blocks); only on a tier over a DiskBlockStore.
  DiskBlockStore& store();
  const DiskBlockStore& store() const;
  BlockStore& block_store() { return *store_; }
  KvTierStats stats() const;
  // Why the latest block write failed (the store's message); empty when none has.
  std::string last_write_error() const;  // any thread

  // --- Engine hooks (the engine's thread).
  // Collects finished loads (their blocks enter the prefix index; the sequences become
  // admissible), then starts loads for waiting sequences whose prefix continues on disk.
  // find(seq id): the live sequence, or null once it is gone. compute_seconds_per_token: what
  // prefill costs a token now (0: not known yet); a remote store's load that would take longer
  // than computing its tokens (and than the store's timeout) ends at that deadline.
  void BeforePlan(KvCacheManager& kv, const std::vector<Sequence*>& waiting,
                  const std::function<Sequence*(SeqId)>& find,
                  double compute_seconds_per_token = 0);
  // The sequence committed blocks (its table's hashes grew): write-through offers them.
  void AfterCommit(Sequence& seq, const KvCacheManager& kv);
  // KvCacheManager's uncache listener.
  void OnUncache(BlockId id, const BlockHash& hash, bool reused);
  // Waits (at most timeout_ms) for a load to end: an engine with nothing else to run.
  bool loads_outstanding() const { return !loads_.empty(); }
  void WaitForLoad(int64_t timeout_ms) { loader_->WaitDone(timeout_ms); }
  // Offers every indexed block not yet stored; then, when wait, waits for the writes (at most
  // config.flush_timeout_ms). Returns the blocks offered.
  int64_t Flush(const KvCacheManager& kv, bool wait);
  // Offers the given blocks now (those indexed in RAM and not stored: a KV document under
  // write-back). Returns how many were offered.
  int64_t Persist(const KvCacheManager& kv, const std::vector<BlockHash>& hashes);
  // Waits until every offered block is written (any thread); false on timeout or failure.
  bool WaitForWrites(int64_t timeout_ms);

 private:
  // BeforePlan's parts: finished loads' blocks into the prefix index (and their problems
  // logged, once each kind), then a load started for one waiting sequence whose prefix
  // continues in this tier.
  void CollectLoads(KvCacheManager& kv, const std::function<Sequence*(SeqId)>& find);
  void LogLoad(const LoadResult& r);
  void StartLoad(KvCacheManager& kv, Sequence* seq, bool available,
                 double compute_seconds_per_token);
  struct BlockMeta {
    BlockHash parent;
    std::vector<int32_t> tokens;
    int32_t index = 0;  // the block's place in its chain: its first position is index * size
  };
  struct Load {
    SeqId seq;
    std::vector<BlockId> blocks;
    std::vector<BlockHash> hashes;
    BlockHash first_parent;
    std::vector<int32_t> tokens;  // [blocks][block_size]
  };
  KvTier(const KvTierConfig& config, const BlockIdentity& identity, KvStorage& storage,
         std::unique_ptr<BlockStore> store);
  int bit() const { return 1 << index_; }
  // Copies the block's bytes and queues it for writing; false when it could not be queued.
  bool Offer(BlockId id, const BlockHash& hash, const BlockMeta& meta);
  bool NoWriteNeeded(const BlockHash& hash) const {  // stored, queued, or its name unusable
    return store_->Contains(hash) || writer_->Pending(hash) || store_->Unusable(hash);
  }

  int index_ = 0;
  KvTierConfig config_;
  BlockIdentity identity_;
  KvStorage& storage_;
  std::unique_ptr<BlockStore> store_;
  std::unique_ptr<BlockWriter> writer_;
  std::unique_ptr<BlockLoader> loader_;
  // Indexed blocks not stored yet, with what their file header needs (write-back keeps every
  // one until the block leaves RAM; write-through only those its queue dropped).
  std::unordered_map<BlockHash, BlockMeta, BlockHashHasher> unsaved_;
  std::unordered_map<uint64_t, Load> loads_;  // by ticket
  uint64_t next_ticket_ = 1;
  std::vector<uint8_t> scratch_;
  std::atomic<int64_t> hits_{0}, misses_{0}, corrupt_{0}, bytes_read_{0}, loaded_tokens_{0};
  std::atomic<int64_t> load_ns_{0}, load_deadlines_{0};
  bool other_codec_logged_ = false;  // the step thread's
  bool reported_failure_ = false;
};

using KvTiers = std::vector<std::unique_ptr<KvTier>>;

}  // namespace kvs
