#include "engine/kv_tier.h"

#include <algorithm>
#include <chrono>

#include "core/check.h"
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
  if (name.rfind("tc:", 0) == 0) {
    auto options = ParseTransformCodec(name);
    if (!options.ok()) return options.status();
    return BlockCodec::kTransform;
  }
  return Status::Error("--kv-disk-codec " + name + ": expected raw, zstd or tc:BITS");
}

std::unique_ptr<KvTier> KvTier::Make(const KvTierConfig& config, const BlockIdentity& identity,
                                     KvStorage& storage, std::unique_ptr<BlockStore> store) {
  return std::unique_ptr<KvTier>(new KvTier(config, identity, storage, std::move(store)));
}

KvTier::KvTier(const KvTierConfig& config, const BlockIdentity& identity, KvStorage& storage,
               std::unique_ptr<BlockStore> store)
    : config_(config), identity_(identity), storage_(storage), store_(std::move(store)) {
  const int64_t block_bytes = static_cast<int64_t>(storage_.geometry().BytesPerBlock());
  const int64_t queued = std::max<int64_t>(16, config_.write_queue_bytes / block_bytes);
  // A local store that refuses writes is full or gone for good: the tier turns itself off. A
  // remote one comes back: its writes fail fast while it is down and resume when it answers.
  writer_ = std::make_unique<BlockWriter>(
      *store_, static_cast<int32_t>(std::min<int64_t>(queued, 1 << 20)),
      store_->Recovers() ? 0 : BlockWriter::kFailuresToStop, config_.transform);
  loader_ = std::make_unique<BlockLoader>(
      *store_, identity_,
      [this](BlockId id, std::span<const uint8_t> payload) {
        // The block is held for this load: no step reads or
        // writes it meanwhile.
        return storage_.WriteBlock(id.value, payload);
      },
      config_.transform);
  corrupt_ = store_->counters().corrupt_at_open;
}

DiskBlockStore& KvTier::store() {
  auto* disk = dynamic_cast<DiskBlockStore*>(store_.get());
  KVS_CHECK(disk != nullptr);
  return *disk;
}

const DiskBlockStore& KvTier::store() const {
  return const_cast<KvTier*>(this)->store();
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
  s.load_deadlines = load_deadlines_;
  s.load_seconds = static_cast<double>(load_ns_) * 1e-9;
  s.bytes_written = w.bytes_written;
  s.payload_bytes_written = w.payload_bytes;
  s.blocks_written = w.written;
  s.dropped = w.dropped;
  s.write_errors = w.errors;
  s.failed = w.failed;
  // What the store counts itself wins over the tier's own count (a remote store's wire bytes).
  const BlockStoreCounters c = store_->counters();
  s.up = c.up && !w.failed;
  s.errors = c.errors >= 0 ? c.errors : w.errors;
  if (c.bytes_read >= 0) s.bytes_read = c.bytes_read;
  if (c.bytes_written >= 0) s.bytes_written = c.bytes_written;
  s.usage_bytes = c.usage_bytes;
  s.capacity_bytes = c.capacity_bytes;
  s.blocks_stored = c.blocks;
  return s;
}

std::string KvTier::last_write_error() const {
  return writer_->last_error();
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
  header.first_position = meta.index * storage_.geometry().block_size;
  return writer_->OfferBlock(std::move(header), std::move(payload), config_.zstd_level);
}

void KvTier::AfterCommit(Sequence& seq, const KvCacheManager& kv) {
  const BlockTable& table = kv.Table(seq.id);
  const int32_t bs = kv.block_size();
  const int32_t n = static_cast<int32_t>(table.hashes.size());
  int32_t& seen = seq.tier_seen[index_];
  seen = std::min(seen, n);  // a rollback or compaction cut the list
  for (int32_t i = seen; i < n; ++i) {
    const BlockHash& hash = table.hashes[i];
    if (unsaved_.contains(hash) || NoWriteNeeded(hash)) continue;
    BlockMeta meta{
        i == 0 ? BlockHash{} : table.hashes[i - 1],
        std::vector<int32_t>(seq.tokens.begin() + i * bs, seq.tokens.begin() + (i + 1) * bs), i};
    if (config_.policy == KvDiskPolicy::kWriteThrough && Offer(table.blocks[i], hash, meta)) {
      continue;
    }
    unsaved_.emplace(hash, std::move(meta));  // written when it leaves RAM, or at Flush
  }
  seen = n;
}

void KvTier::OnUncache(BlockId id, const BlockHash& hash, bool reused) {
  auto it = unsaved_.find(hash);
  if (it == unsaved_.end()) return;
  // Reused: its bytes are still whole until the step that took it runs; write them now.
  if (reused && !NoWriteNeeded(hash)) Offer(id, hash, it->second);
  unsaved_.erase(it);
}

void KvTier::CollectLoads(KvCacheManager& kv, const std::function<Sequence*(SeqId)>& find) {
  const int32_t bs = kv.block_size();
  for (const LoadResult& r : loader_->TakeDone()) {
    auto it = loads_.find(r.ticket);
    if (it == loads_.end()) continue;
    Load& load = it->second;
    kv.ReleaseHeld(load.blocks, load.hashes, r.n_loaded, load.first_parent, load.tokens);
    hits_ += r.n_loaded;
    misses_ += static_cast<int64_t>(load.blocks.size()) - r.n_loaded;
    corrupt_ += r.corrupt;
    bytes_read_ += r.bytes_read;
    loaded_tokens_ += int64_t{r.n_loaded} * bs;
    load_ns_ += static_cast<int64_t>(r.seconds * 1e9);
    LogLoad(r);
    if (Sequence* seq = find(load.seq)) {
      seq->kv_loading = false;
      seq->tier_tokens[index_] += r.n_loaded * bs;
    }
    loads_.erase(it);
  }
}

void KvTier::LogLoad(const LoadResult& r) {
  if (r.deadline_passed && load_deadlines_++ == 0) {
    KVS_LOG_WARN(
        "kv %.*s: a load ran past its deadline (the store answers slower than "
        "computing the tokens would): the rest was computed (logged once)",
        static_cast<int>(store_->name().size()), store_->name().data());
  }
  if (r.corrupt) {
    KVS_LOG_WARN("kv %.*s: %d stored block(s) failed a check, recomputed (and removed%s): %s",
                 static_cast<int>(store_->name().size()), store_->name().data(), r.corrupt,
                 store_->KnowsContents()
                     ? ", unless a directory with contents holds the name: then never used"
                     : "",
                 r.error.c_str());
  }
  if (!other_codec_logged_ && loader_->other_codec_blocks() > 0) {
    other_codec_logged_ = true;
    KVS_LOG_WARN(
        "kv %.*s: stored blocks were written with other codec settings (another tc budget, "
        "calibration or none): recomputed and stored again with this tier's (logged once)",
        static_cast<int>(store_->name().size()), store_->name().data());
  }
}

void KvTier::StartLoad(KvCacheManager& kv, Sequence* seq, bool available,
                       double compute_seconds_per_token) {
  const int32_t bs = kv.block_size();
  // A tier above this one loads it first (or it is loading from this one).
  if (seq->kv_loading || (seq->tiers_probed & bit())) return;
  seq->tiers_probed |= bit();
  const int32_t n = seq->n_committed();
  if (n < 1) return;
  // The blocks a match may use: whole ones, never the last token's (KvCacheManager::Match).
  const size_t usable = std::min(seq->block_hashes.size(), static_cast<size_t>((n - 1) / bs));
  const size_t in_ram = kv.Match(seq->block_hashes, n).blocks.size();
  if (!available) {
    misses_ += static_cast<int64_t>(usable - std::min(usable, in_ram));
    return;
  }
  size_t on_disk = 0;
  if (store_->KnowsContents()) {
    while (in_ram + on_disk < usable && store_->Contains(seq->block_hashes[in_ram + on_disk])) {
      ++on_disk;
    }
  } else {
    on_disk = usable - in_ram;  // asked by the loader; what it does not find goes back
  }
  const int32_t room = kv.num_free_blocks() - kv.watermark_blocks();
  // No free block to load into while running sequences hold the pool: asked again at the next
  // step (the sequence waits for room either way; once blocks free up, loading beats
  // recomputing).
  if (on_disk > 0 && room <= 0) {
    seq->tiers_probed &= static_cast<uint8_t>(~bit());
    return;
  }
  const size_t take = std::min<size_t>(on_disk, static_cast<size_t>(std::max(room, 0)));
  misses_ += static_cast<int64_t>(usable - in_ram - take);
  if (take == 0) return;
  LoadJob job;
  job.ticket = next_ticket_++;
  if (!kv.HoldBlocks(static_cast<int32_t>(take), &job.blocks)) return;
  job.hashes.assign(seq->block_hashes.begin() + in_ram, seq->block_hashes.begin() + in_ram + take);
  job.first_parent = in_ram == 0 ? BlockHash{} : seq->block_hashes[in_ram - 1];
  job.tokens.assign(seq->tokens.begin() + in_ram * bs, seq->tokens.begin() + (in_ram + take) * bs);
  if (const int64_t timeout_ms = store_->timeout_ms(); timeout_ms > 0) {
    // Worth waiting for only while faster than computing: a slow store (or a load queued
    // behind one) must not hold the sequence longer than its prefill would take.
    const double budget_s = std::max(static_cast<double>(timeout_ms) / 1e3,
                                     compute_seconds_per_token * static_cast<double>(take) * bs);
    job.deadline = std::chrono::steady_clock::now() +
                   std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                       std::chrono::duration<double>(budget_s));
  }
  loads_.emplace(job.ticket, Load{seq->id, job.blocks, job.hashes, job.first_parent, job.tokens});
  seq->kv_loading = true;
  loader_->Submit(std::move(job));
}

void KvTier::BeforePlan(KvCacheManager& kv, const std::vector<Sequence*>& waiting,
                        const std::function<Sequence*(SeqId)>& find,
                        double compute_seconds_per_token) {
  CollectLoads(kv, find);
  const bool available = store_->Available();
  for (Sequence* seq : waiting) StartLoad(kv, seq, available, compute_seconds_per_token);
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
      KVS_LOG_WARN("kv %.*s: flush stopped after %lld ms: some blocks were not written",
                   static_cast<int>(name().size()), name().data(),
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
