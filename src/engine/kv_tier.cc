#include "engine/kv_tier.h"

#include <signal.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <chrono>

#include "core/log.h"

namespace kvs {

Expected<KvDiskPolicy> ParseKvDiskPolicy(const std::string& name) {
  if (name == "write-through") return KvDiskPolicy::kWriteThrough;
  if (name == "write-back") return KvDiskPolicy::kWriteBack;
  return Status::Error("--kv-disk-policy " + name + ": expected write-through or write-back");
}

Expected<BlockCodec> ParseBlockCodec(const std::string& name) {
  if (name == "raw") return BlockCodec::kRaw;
  if (name == "zstd") return BlockCodec::kZstd;
  return Status::Error("--kv-disk-codec " + name + ": expected raw or zstd");
}

Expected<std::unique_ptr<KvTier>> KvTier::Open(const KvTierConfig& config,
                                               const BlockIdentity& identity, KvStorage& storage,
                                               const std::function<void(int64_t)>& progress) {
  if (config.dir.empty()) return Status::Error("--kv-disk: no directory given");
  // A file size limit (ulimit -f) must fail a block's write with EFBIG, which turns the tier
  // off, rather than kill the process with SIGXFSZ.
  ::signal(SIGXFSZ, SIG_IGN);
  auto store = DiskBlockStore::Open(config.dir, UINT64_MAX, progress);
  if (!store.ok()) return store.status();
  KvTierConfig c = config;
  if (c.capacity_bytes == 0) {
    // 20G, or what the file system has free (plus what the store holds already), if less.
    struct statvfs fs;
    uint64_t room = kDefaultKvDiskBytes;
    if (::statvfs(c.dir.c_str(), &fs) == 0) {
      room = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize + (*store)->usage_bytes();
    }
    c.capacity_bytes = std::min(kDefaultKvDiskBytes, room);
  }
  const uint64_t min_bytes = 4 * storage.geometry().BytesPerBlock();
  if (c.capacity_bytes < min_bytes) {
    if (config.capacity_bytes != 0) {
      return Status::Error(StrFormat(
          "--kv-disk-size %llu bytes holds fewer than 4 blocks of this KV format (%llu bytes each)",
          static_cast<unsigned long long>(c.capacity_bytes),
          static_cast<unsigned long long>(storage.geometry().BytesPerBlock())));
    }
    // A full (or read-only) file system: the blocks there still load; new ones are not written.
    KVS_LOG_WARN("kv disk: %s has no room for new blocks: the tier only reads what it holds",
                 c.dir.c_str());
  }
  (*store)->set_capacity(c.capacity_bytes);
  return std::unique_ptr<KvTier>(new KvTier(c, identity, storage, std::move(*store)));
}

KvTier::KvTier(const KvTierConfig& config, const BlockIdentity& identity, KvStorage& storage,
               std::unique_ptr<DiskBlockStore> store)
    : config_(config), identity_(identity), storage_(storage), store_(std::move(store)) {
  const int64_t block_bytes = static_cast<int64_t>(storage_.geometry().BytesPerBlock());
  const int64_t queued = std::max<int64_t>(16, config_.write_queue_bytes / block_bytes);
  writer_ = std::make_unique<BlockWriter>(*store_,
                                          static_cast<int32_t>(std::min<int64_t>(queued, 1 << 20)));
  loader_ = std::make_unique<BlockLoader>(*store_, identity_,
                                          [this](BlockId id, std::span<const uint8_t> payload) {
                                            // The block is held for this load: no step reads or
                                            // writes it meanwhile.
                                            return storage_.WriteBlock(id.value, payload);
                                          });
  corrupt_ = store_->rejected_at_open();
}

KvTier::~KvTier() {
  loader_.reset();  // before the pool's blocks could go: it may be writing one
  writer_.reset();
}

KvTierStats KvTier::stats() const {
  const BlockWriterStats w = writer_->stats();
  KvTierStats s;
  s.hits = hits_;
  s.misses = misses_;
  s.corrupt = corrupt_;
  s.bytes_read = bytes_read_;
  s.loaded_tokens = loaded_tokens_;
  s.load_seconds = static_cast<double>(load_ns_) * 1e-9;
  s.bytes_written = w.bytes_written;
  s.payload_bytes_written = w.payload_bytes;
  s.blocks_written = w.written;
  s.dropped = w.dropped;
  s.failed = w.failed;
  s.usage_bytes = static_cast<int64_t>(store_->usage_bytes());
  s.blocks_stored = store_->num_blocks();
  return s;
}

bool KvTier::Offer(BlockId id, const BlockHash& hash, const BlockMeta& meta) {
  std::vector<uint8_t> payload;
  if (!storage_.ReadBlock(id.value, &payload).ok()) return false;
  BlockFileHeader header;
  header.identity = identity_;
  header.hash = hash;
  header.parent = meta.parent;
  header.codec = config_.codec;
  header.tokens = meta.tokens;
  return writer_->OfferBlock(std::move(header), std::move(payload), config_.zstd_level);
}

void KvTier::AfterCommit(Sequence& seq, const KvCacheManager& kv) {
  const BlockTable& table = kv.Table(seq.id);
  const int32_t bs = kv.block_size();
  const int32_t n = static_cast<int32_t>(table.hashes.size());
  seq.tier_seen = std::min(seq.tier_seen, n);  // a rollback or compaction cut the list
  for (int32_t i = seq.tier_seen; i < n; ++i) {
    const BlockHash& hash = table.hashes[i];
    if (unsaved_.contains(hash) || NoWriteNeeded(hash)) continue;
    BlockMeta meta{
        i == 0 ? BlockHash{} : table.hashes[i - 1],
        std::vector<int32_t>(seq.tokens.begin() + i * bs, seq.tokens.begin() + (i + 1) * bs)};
    if (config_.policy == KvDiskPolicy::kWriteThrough && Offer(table.blocks[i], hash, meta)) {
      continue;
    }
    unsaved_.emplace(hash, std::move(meta));  // written when it leaves RAM, or at Flush
  }
  seq.tier_seen = n;
}

void KvTier::OnUncache(BlockId id, const BlockHash& hash, bool reused) {
  auto it = unsaved_.find(hash);
  if (it == unsaved_.end()) return;
  // Reused: its bytes are still whole until the step that took it runs; write them now.
  if (reused && !NoWriteNeeded(hash)) Offer(id, hash, it->second);
  unsaved_.erase(it);
}

void KvTier::BeforePlan(KvCacheManager& kv, const std::vector<Sequence*>& waiting,
                        const std::function<Sequence*(SeqId)>& find) {
  const int32_t bs = kv.block_size();
  for (const LoadResult& r : loader_->TakeDone()) {
    auto it = loads_.find(r.ticket);
    if (it == loads_.end()) continue;
    Load& load = it->second;
    kv.ReleaseHeld(load.blocks, load.hashes, r.n_loaded);
    hits_ += r.n_loaded;
    misses_ += static_cast<int64_t>(load.blocks.size()) - r.n_loaded;
    corrupt_ += r.corrupt;
    bytes_read_ += r.bytes_read;
    loaded_tokens_ += int64_t{r.n_loaded} * bs;
    load_ns_ += static_cast<int64_t>(r.seconds * 1e9);
    if (r.corrupt) {
      KVS_LOG_WARN(
          "kv disk: %d stored block(s) failed a check, recomputed (and removed, unless a "
          "directory with contents holds the name: then never used): %s",
          r.corrupt, r.error.c_str());
    }
    if (Sequence* seq = find(load.seq)) {
      seq->kv_loading = false;
      seq->disk_tokens += r.n_loaded * bs;
    }
    loads_.erase(it);
  }
  for (Sequence* seq : waiting) {
    if (seq->kv_loading || seq->tier_probed) continue;
    seq->tier_probed = true;
    const int32_t n = seq->n_committed();
    if (n < 1) continue;
    // The blocks a match may use: whole ones, never the last token's (KvCacheManager::Match).
    const size_t usable = std::min(seq->block_hashes.size(), static_cast<size_t>((n - 1) / bs));
    const size_t in_ram = kv.Match(seq->block_hashes, n).blocks.size();
    size_t on_disk = 0;
    while (in_ram + on_disk < usable && store_->Contains(seq->block_hashes[in_ram + on_disk])) {
      ++on_disk;
    }
    const int32_t room = kv.num_free_blocks() - kv.watermark_blocks();
    const size_t take = std::min<size_t>(on_disk, static_cast<size_t>(std::max(room, 0)));
    misses_ += static_cast<int64_t>(usable - in_ram - take);
    if (take == 0) continue;
    LoadJob job;
    job.ticket = next_ticket_++;
    if (!kv.HoldBlocks(static_cast<int32_t>(take), &job.blocks)) continue;
    job.hashes.assign(seq->block_hashes.begin() + in_ram,
                      seq->block_hashes.begin() + in_ram + take);
    job.first_parent = in_ram == 0 ? BlockHash{} : seq->block_hashes[in_ram - 1];
    job.tokens.assign(seq->tokens.begin() + in_ram * bs,
                      seq->tokens.begin() + (in_ram + take) * bs);
    loads_.emplace(job.ticket, Load{seq->id, job.blocks, job.hashes});
    seq->kv_loading = true;
    loader_->Submit(std::move(job));
  }
}

int64_t KvTier::Flush(const KvCacheManager& kv, bool wait) {
  const auto start = std::chrono::steady_clock::now();
  const auto left_ms = [&] {
    const auto spent = std::chrono::duration_cast<std::chrono::milliseconds>(
                           std::chrono::steady_clock::now() - start)
                           .count();
    return std::max<int64_t>(0, config_.flush_timeout_ms - spent);
  };
  int64_t offered = 0, not_written = 0;
  for (const auto& [hash, id] : kv.CachedBlocks()) {
    auto it = unsaved_.find(hash);
    if (it == unsaved_.end()) continue;
    if (!NoWriteNeeded(hash)) {
      bool ok = Offer(id, hash, it->second);
      // A full queue: let it drain (within the bound) and try once more.
      if (!ok && wait && !writer_->stats().failed && left_ms() > 0) {
        writer_->Flush(left_ms());
        ok = Offer(id, hash, it->second);
      }
      if (!ok) {
        ++not_written;
        continue;
      }
      ++offered;
    }
    unsaved_.erase(it);
  }
  if (wait) {
    const bool drained = writer_->Flush(left_ms());
    if (!drained || not_written > 0) {
      KVS_LOG_WARN("kv disk: flush stopped after %lld ms: some blocks were not written",
                   static_cast<long long>(config_.flush_timeout_ms - left_ms()));
    }
  }
  return offered;
}

int64_t KvTier::Persist(const KvCacheManager& kv, const std::vector<BlockHash>& hashes) {
  int64_t offered = 0;
  for (const BlockHash& hash : hashes) {
    if (NoWriteNeeded(hash)) continue;
    auto it = unsaved_.find(hash);
    const std::optional<BlockId> id = kv.CachedBlock(hash);
    if (it == unsaved_.end() || !id) continue;
    if (Offer(*id, hash, it->second)) {
      ++offered;
      unsaved_.erase(it);
    }
  }
  return offered;
}

bool KvTier::WaitForWrites(int64_t timeout_ms) {
  return writer_->Flush(timeout_ms);
}

}  // namespace kvs
