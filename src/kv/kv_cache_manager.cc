#include "kv/kv_cache_manager.h"

// For XXH3_state_t, so that a block hash streams its parts from the stack.
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include <algorithm>
#include <cstring>

#include "core/check.h"

namespace kvs {
namespace {
const BlockTable kEmptyTable;
}  // namespace

BlockHash PrefixCacheKey(std::string_view model_fingerprint, std::string_view kv_types,
                         std::string_view cache_salt) {
  std::string text;
  for (std::string_view part : {model_fingerprint, kv_types, cache_salt}) {
    text += std::to_string(part.size()) + ":";  // length-prefixed: no two splits collide
    text += part;
  }
  const XXH128_hash_t h = XXH3_128bits(text.data(), text.size());
  return BlockHash{h.low64, h.high64};
}

BlockHash KvCacheManager::ChainHash(const BlockHash& parent, const BlockHash& key,
                                    const int32_t* tokens) const {
  // hash(parent hash, extra key, the block's token ids): XXH3-128 of those bytes back to back.
  // Streamed, XXH3 gives the same hash as over one buffer, so the keys are the ones a
  // concatenated buffer gave, without allocating one per block.
  static_assert(sizeof(BlockHash) == 16);
  ++num_blocks_hashed_;
  XXH3_state_t state;
  XXH3_INITSTATE(&state);
  XXH3_128bits_reset(&state);
  XXH3_128bits_update(&state, &parent, sizeof(BlockHash));
  XXH3_128bits_update(&state, &key, sizeof(BlockHash));
  XXH3_128bits_update(&state, tokens, sizeof(int32_t) * static_cast<size_t>(block_size_));
  const XXH128_hash_t h = XXH3_128bits_digest(&state);
  return BlockHash{h.low64, h.high64};
}

KvCacheManager::KvCacheManager(int32_t n_blocks, int32_t block_size, int32_t watermark_blocks)
    : pool_(n_blocks),
      block_size_(block_size),
      watermark_(watermark_blocks),
      block_hash_(static_cast<size_t>(n_blocks)),
      block_cached_(static_cast<size_t>(n_blocks), false),
      held_(static_cast<size_t>(n_blocks), 0) {
  KVS_CHECK(block_size > 0 && watermark_blocks >= 0);
}

const BlockTable& KvCacheManager::Table(SeqId seq) const {
  auto it = tables_.find(seq);
  return it == tables_.end() ? kEmptyTable : it->second;
}

bool KvCacheManager::LastBlockNeedsCopy(const BlockTable& t) const {
  if (t.num_tokens % block_size_ == 0) return false;  // full (or no) last block: never written
  const BlockId last = t.blocks[(t.num_tokens - 1) / block_size_];
  return pool_.ref_count(last) > 1;
}

int32_t KvCacheManager::BlocksToAppend(SeqId seq, int32_t n_new) const {
  if (n_new <= 0) return 0;
  const BlockTable& t = Table(seq);
  const int32_t have = static_cast<int32_t>(t.blocks.size());
  const int32_t grow = std::max(0, BlocksFor(t.num_tokens + n_new) - have);
  return grow + (LastBlockNeedsCopy(t) ? 1 : 0);
}

int32_t KvCacheManager::BlocksFreedBy(SeqId seq) const {
  int32_t n = 0;
  for (BlockId id : Table(seq).blocks) n += pool_.ref_count(id) == 1 ? 1 : 0;
  return n;
}

bool KvCacheManager::AllocateBlocks(int32_t n, std::vector<BlockId>* out) {
  const size_t first = out->size();
  if (!pool_.Allocate(n, out)) return false;
  // The least recently used cached blocks are the ones reused: their bytes are overwritten.
  for (size_t i = first; i < out->size(); ++i) Uncache((*out)[i], /*reused=*/true);
  return true;
}

void KvCacheManager::Uncache(BlockId id, bool reused) {
  if (!block_cached_[id.value]) return;
  if (uncache_listener_) uncache_listener_(id, block_hash_[id.value], reused);
  cached_.erase(block_hash_[id.value]);
  block_cached_[id.value] = false;
}

std::optional<BlockId> KvCacheManager::CachedBlock(const BlockHash& hash) const {
  auto it = cached_.find(hash);
  if (it == cached_.end()) return std::nullopt;
  return it->second;
}

std::vector<std::pair<BlockHash, BlockId>> KvCacheManager::CachedBlocks() const {
  return {cached_.begin(), cached_.end()};
}

int32_t KvCacheManager::DropFreeCachedBlocks() {
  std::vector<BlockId> drop;
  for (const auto& [hash, id] : cached_) {
    if (pool_.ref_count(id) == 0) drop.push_back(id);
  }
  for (BlockId id : drop) Uncache(id);
  return static_cast<int32_t>(drop.size());
}

bool KvCacheManager::HoldBlocks(int32_t n, std::vector<BlockId>* out) {
  const size_t first = out->size();
  if (!AllocateBlocks(n, out)) return false;
  for (size_t i = first; i < out->size(); ++i) held_[(*out)[i].value] = 1;
  num_held_ += n;
  return true;
}

void KvCacheManager::ReleaseHeld(std::span<const BlockId> blocks, std::span<const BlockHash> hashes,
                                 int32_t n_loaded, const BlockHash& first_parent,
                                 std::span<const int32_t> tokens) {
  const size_t bs = static_cast<size_t>(block_size_);
  for (size_t i = 0; i < blocks.size(); ++i) {
    const BlockId id = blocks[i];
    KVS_CHECK(held_[id.value] == 1);
    held_[id.value] = 0;
    --num_held_;
    if (static_cast<int32_t>(i) < n_loaded && prefix_caching_ && !cached_.contains(hashes[i])) {
      cached_.emplace(hashes[i], id);
      block_hash_[id.value] = hashes[i];
      block_cached_[id.value] = true;
      Indexed(
          id, hashes[i], i == 0 ? first_parent : hashes[i - 1],
          tokens.size() >= (i + 1) * bs ? tokens.subspan(i * bs, bs) : std::span<const int32_t>());
    }
  }
  std::vector<BlockId> reversed(blocks.rbegin(), blocks.rend());
  KVS_CHECK(pool_.Free(reversed).ok());
}

void KvCacheManager::HashFullBlocks(const int32_t* tokens, int32_t n, const BlockHash& key,
                                    std::vector<BlockHash>* hashes) const {
  if (!prefix_caching_) return;
  const size_t full = static_cast<size_t>(std::max(n, 0) / block_size_);
  while (hashes->size() < full) {
    const size_t i = hashes->size();
    const BlockHash parent = i == 0 ? BlockHash{} : (*hashes)[i - 1];
    hashes->push_back(ChainHash(parent, key, tokens + i * static_cast<size_t>(block_size_)));
  }
}

PrefixMatch KvCacheManager::Match(std::span<const BlockHash> hashes, int32_t n) const {
  PrefixMatch m;
  if (!prefix_caching_ || n < 1) return m;
  // Whole blocks only, and never the last token's: its logits are needed, so it is computed.
  const size_t usable = std::min(hashes.size(), static_cast<size_t>((n - 1) / block_size_));
  for (size_t i = 0; i < usable; ++i) {
    auto it = cached_.find(hashes[i]);
    if (it == cached_.end()) break;
    m.blocks.push_back(it->second);
    m.hashes.push_back(hashes[i]);
    m.n_free += pool_.ref_count(it->second) == 0 ? 1 : 0;
    m.n_tokens += block_size_;
  }
  return m;
}

PrefixMatch KvCacheManager::Match(const int32_t* tokens, int32_t n, const BlockHash& key) const {
  std::vector<BlockHash> hashes;
  if (n >= 1) HashFullBlocks(tokens, n - 1, key, &hashes);  // the blocks a match may use
  return Match(hashes, n);
}

void KvCacheManager::AdoptPrefix(SeqId seq, const PrefixMatch& match) {
  KVS_CHECK(!tables_.contains(seq));
  BlockTable& t = tables_[seq];
  for (BlockId id : match.blocks) KVS_CHECK(pool_.Acquire(id).ok());
  t.blocks = match.blocks;
  t.hashes = match.hashes;
  t.num_tokens = match.n_tokens;
}

void KvCacheManager::CommitFullBlocks(SeqId seq, std::span<const BlockHash> hashes,
                                      int32_t n_computed, std::span<const int32_t> tokens) {
  const size_t bs = static_cast<size_t>(block_size_);
  if (!prefix_caching_) return;
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  BlockTable& t = it->second;
  if (t.compacted) return;
  const size_t full = std::min(
      static_cast<size_t>(std::min(n_computed, t.num_tokens) / block_size_), hashes.size());
  while (t.hashes.size() < full) {
    const size_t i = t.hashes.size();
    const BlockHash h = hashes[i];
    t.hashes.push_back(h);
    const BlockId id = t.blocks[i];
    // The first block computed for a hash is the cached one; a duplicate stays private.
    if (!block_cached_[id.value] && !cached_.contains(h)) {
      cached_.emplace(h, id);
      block_hash_[id.value] = h;
      block_cached_[id.value] = true;
      Indexed(
          id, h, i == 0 ? BlockHash{} : hashes[i - 1],
          tokens.size() >= (i + 1) * bs ? tokens.subspan(i * bs, bs) : std::span<const int32_t>());
    }
  }
}

bool KvCacheManager::Append(SeqId seq, int32_t n_new, std::vector<BlockCopy>* copies) {
  KVS_CHECK(n_new >= 0);
  if (n_new == 0) {
    tables_.try_emplace(seq);
    return true;
  }
  const int32_t need = BlocksToAppend(seq, n_new);
  std::vector<BlockId> fresh;
  if (!AllocateBlocks(need, &fresh)) return false;
  BlockTable& t = tables_[seq];
  size_t next = 0;
  if (LastBlockNeedsCopy(t)) {
    BlockId& last = t.blocks[(t.num_tokens - 1) / block_size_];
    copies->push_back({last, fresh[next]});
    const BlockId shared = last;
    last = fresh[next++];
    KVS_CHECK(pool_.Free({&shared, 1}).ok());  // others still hold it: only the count drops
  }
  t.blocks.insert(t.blocks.end(), fresh.begin() + static_cast<ptrdiff_t>(next), fresh.end());
  t.num_tokens += n_new;
  return true;
}

bool KvCacheManager::Reserve(SeqId seq, int32_t n_positions) {
  const BlockTable& t = Table(seq);
  const int32_t need = std::max(0, BlocksFor(n_positions) - static_cast<int32_t>(t.blocks.size()));
  std::vector<BlockId> fresh;
  if (!AllocateBlocks(need, &fresh)) return false;
  BlockTable& mt = tables_[seq];
  mt.blocks.insert(mt.blocks.end(), fresh.begin(), fresh.end());
  return true;
}

int64_t KvCacheManager::Slot(SeqId seq, int32_t pos) const {
  const BlockTable& t = Table(seq);
  KVS_CHECK(pos >= 0 && pos < t.num_tokens);
  return static_cast<int64_t>(t.blocks[pos / block_size_].value) * block_size_ + pos % block_size_;
}

Status KvCacheManager::Fork(SeqId parent, SeqId child) {
  auto it = tables_.find(parent);
  if (it == tables_.end())
    return Status::Error(StrFormat("fork: no sequence %lld", (long long)parent.value));
  if (tables_.contains(child)) {
    return Status::Error(StrFormat("fork: sequence %lld already exists", (long long)child.value));
  }
  // Only the blocks holding positions are shared; blocks reserved past them (a contiguous-style
  // reservation) stay the parent's, or both would write them.
  BlockTable copy = it->second;  // copied before emplace: emplace may rehash and move it
  copy.blocks.resize(std::min<size_t>(copy.blocks.size(), BlocksFor(copy.num_tokens)));
  for (BlockId id : copy.blocks) KVS_RETURN_IF_ERROR(pool_.Ref(id));
  tables_.emplace(child, std::move(copy));
  return Status::Ok();
}

void KvCacheManager::Free(SeqId seq) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  std::vector<BlockId>& blocks = it->second.blocks;
  std::reverse(blocks.begin(), blocks.end());
  KVS_CHECK(pool_.Free(blocks).ok());
  tables_.erase(it);
}

Status KvCacheManager::Truncate(SeqId seq, int32_t n_tokens) {
  const BlockTable& held = Table(seq);
  if (n_tokens < 0 || n_tokens > held.num_tokens) {
    return Status::Error(StrFormat("truncate: sequence %lld holds %d positions, not %d",
                                   (long long)seq.value, held.num_tokens, n_tokens));
  }
  auto it = tables_.find(seq);
  if (it == tables_.end()) return Status::Ok();  // empty, truncated to 0
  BlockTable& t = it->second;
  // Every block past the new end goes, reserved ones (Reserve) included: a reservation past a
  // rollback is dropped, as the positions it was for are.
  const size_t keep = static_cast<size_t>(BlocksFor(n_tokens));
  if (t.blocks.size() > keep) {
    std::reverse(t.blocks.begin() + static_cast<ptrdiff_t>(keep), t.blocks.end());
    KVS_CHECK(pool_.Free(std::span<const BlockId>(t.blocks).subspan(keep)).ok());
    t.blocks.resize(keep);
  }
  t.num_tokens = n_tokens;
  const size_t full = static_cast<size_t>(n_tokens / block_size_);
  if (t.hashes.size() > full) t.hashes.resize(full);
  // A kept block that is now partial will be written from n_tokens on: out of the index.
  if (keep > full) Uncache(t.blocks[full]);
  return Status::Ok();
}

Status KvCacheManager::Compact(SeqId seq, int32_t first_rewritten, int32_t n_slots) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) {
    return Status::Error(StrFormat("compact: no sequence %lld", (long long)seq.value));
  }
  BlockTable& t = it->second;
  if (n_slots < 0 || n_slots > t.num_tokens || first_rewritten < 0 || first_rewritten > n_slots) {
    return Status::Error(
        StrFormat("compact: sequence %lld holds %d slots, not %d (rewritten from %d)",
                  (long long)seq.value, t.num_tokens, n_slots, first_rewritten));
  }
  const size_t first_block = static_cast<size_t>(first_rewritten / block_size_);
  const size_t kept_blocks = static_cast<size_t>(BlocksFor(n_slots));
  for (size_t i = first_block; i < kept_blocks; ++i) {
    if (pool_.ref_count(t.blocks[i]) > 1) {
      return Status::Error(StrFormat("compact: block %d of sequence %lld is shared",
                                     t.blocks[i].value, (long long)seq.value));
    }
  }
  for (size_t i = first_block; i < kept_blocks; ++i) Uncache(t.blocks[i]);
  if (t.hashes.size() > first_block) t.hashes.resize(first_block);
  t.compacted = true;
  return Truncate(seq, n_slots);
}

int32_t KvCacheManager::SharedPrefixSlots(SeqId seq) const {
  const BlockTable& t = Table(seq);
  int32_t n = 0;
  for (BlockId id : t.blocks) {
    if (pool_.ref_count(id) <= 1) break;
    n += block_size_;
  }
  return std::min(n, t.num_tokens);
}

Status KvCacheManager::VerifyIntegrity() const {
  KVS_RETURN_IF_ERROR(pool_.VerifyIntegrity());
  std::vector<int32_t> holders(static_cast<size_t>(pool_.num_blocks()), 0);
  for (const auto& [seq, t] : tables_) {
    const long long s = static_cast<long long>(seq.value);
    if (static_cast<int64_t>(t.num_tokens) > static_cast<int64_t>(t.blocks.size()) * block_size_) {
      return Status::Error(StrFormat("sequence %lld has %d tokens but only %zu blocks", s,
                                     t.num_tokens, t.blocks.size()));
    }
    if (t.hashes.size() > static_cast<size_t>(t.num_tokens / block_size_)) {
      return Status::Error(StrFormat("sequence %lld: %zu block hashes for %d positions", s,
                                     t.hashes.size(), t.num_tokens));
    }
    for (size_t i = 0; i < t.blocks.size(); ++i) {
      const BlockId id = t.blocks[i];
      if (id <= kNullBlock || id.value >= pool_.num_blocks()) {
        return Status::Error(StrFormat("sequence %lld holds invalid block %d", s, id.value));
      }
      ++holders[id.value];
      if (!block_cached_[id.value]) continue;
      // An indexed block is full here (never written again), under the hash this table has.
      if (static_cast<int64_t>(i + 1) * block_size_ > t.num_tokens) {
        return Status::Error(StrFormat(
            "sequence %lld holds indexed block %d as a partial or empty block", s, id.value));
      }
      if (i < t.hashes.size() && !(t.hashes[i] == block_hash_[id.value])) {
        return Status::Error(
            StrFormat("sequence %lld: block %d is indexed under another hash", s, id.value));
      }
    }
  }
  for (const auto& [hash, id] : cached_) {
    if (id <= kNullBlock || id.value >= pool_.num_blocks() || !block_cached_[id.value] ||
        !(block_hash_[id.value] == hash)) {
      return Status::Error(
          StrFormat("prefix index entry for block %d disagrees with the block", id.value));
    }
  }
  int64_t marked = 0;
  for (bool c : block_cached_) marked += c ? 1 : 0;
  if (marked != static_cast<int64_t>(cached_.size())) {
    return Status::Error("blocks marked cached differ from the prefix index");
  }
  for (int32_t id = 1; id < pool_.num_blocks(); ++id) {
    holders[id] += held_[id];
    if (holders[id] != pool_.ref_count(BlockId{id})) {
      return Status::Error(StrFormat("block %d: refcount %d but %d tables hold it", id,
                                     pool_.ref_count(BlockId{id}), holders[id]));
    }
  }
  return Status::Ok();
}

}  // namespace kvs
