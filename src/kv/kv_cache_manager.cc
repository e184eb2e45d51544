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

KvCacheManager::KvCacheManager(int32_t n_blocks, int32_t block_size, int32_t watermark_blocks,
                               std::vector<KvGroupSpec> groups)
    : pool_(n_blocks),
      block_size_(block_size),
      watermark_(watermark_blocks),
      block_hash_(static_cast<size_t>(n_blocks)),
      block_cached_(static_cast<size_t>(n_blocks), false),
      block_group_(static_cast<size_t>(n_blocks), 0),
      held_(static_cast<size_t>(n_blocks), 0),
      specs_(groups) {
  KVS_CHECK(block_size > 0 && watermark_blocks >= 0);
  KVS_CHECK(!groups.empty() && groups.size() <= 255);
  for (const KvGroupSpec& spec : groups) {
    KVS_CHECK(spec.window >= 0);
    groups_.push_back({spec, {}, {}});
  }
}

const BlockTable& KvCacheManager::Table(SeqId seq, int32_t g) const {
  auto it = groups_[g].tables.find(seq);
  return it == groups_[g].tables.end() ? kEmptyTable : it->second;
}

int32_t KvCacheManager::num_cached_blocks() const {
  size_t n = 0;
  for (const Group& group : groups_) n += group.cached.size();
  return static_cast<int32_t>(n);
}

bool KvCacheManager::LastBlockNeedsCopy(const BlockTable& t) const {
  if (t.num_tokens % block_size_ == 0) return false;  // full (or no) last block: never written
  const BlockId last = t.blocks[(t.num_tokens - 1) / block_size_];
  return pool_.ref_count(last) > 1;
}

int32_t KvCacheManager::GroupBlocksToAppend(const BlockTable& t, int32_t n_new) const {
  const int32_t have = static_cast<int32_t>(t.blocks.size());
  const int32_t grow = std::max(0, BlocksFor(t.num_tokens + n_new) - have);
  return grow + (LastBlockNeedsCopy(t) ? 1 : 0);
}

int32_t KvCacheManager::BlocksToAppend(SeqId seq, int32_t n_new) const {
  if (n_new <= 0) return 0;
  int32_t n = 0;
  for (int32_t g = 0; g < num_groups(); ++g) n += GroupBlocksToAppend(Table(seq, g), n_new);
  return n;
}

int32_t KvCacheManager::BlocksFreedBy(SeqId seq) const {
  int32_t n = 0;
  for (int32_t g = 0; g < num_groups(); ++g) {
    for (BlockId id : Table(seq, g).blocks) {
      n += id != kNullBlock && pool_.ref_count(id) == 1 ? 1 : 0;
    }
  }
  return n;
}

int32_t KvCacheManager::BlocksToAdopt(const PrefixMatch& prefix, int32_t n_new) const {
  const int32_t total = BlocksFor(prefix.n_tokens + n_new);
  int32_t need = prefix.n_free + total - static_cast<int32_t>(prefix.blocks.size());
  for (const std::vector<BlockId>& g : prefix.group_blocks) {
    need += total - static_cast<int32_t>(g.size());
  }
  return need;
}

int64_t KvCacheManager::PeakBlocks(int64_t positions, int32_t max_chunk) const {
  return kvs::PeakBlocks(specs_, positions, block_size_, max_chunk);
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
  // The lower tiers and KV events follow the first group's index (the one tiers store).
  const int32_t g = block_group_[id.value];
  if (uncache_listener_ && g == 0) uncache_listener_(id, block_hash_[id.value], reused);
  groups_[g].cached.erase(block_hash_[id.value]);
  block_cached_[id.value] = false;
}

std::optional<BlockId> KvCacheManager::CachedBlock(const BlockHash& hash, int32_t g) const {
  auto it = groups_[g].cached.find(hash);
  if (it == groups_[g].cached.end()) return std::nullopt;
  return it->second;
}

std::vector<std::pair<BlockHash, BlockId>> KvCacheManager::CachedBlocks() const {
  return {groups_[0].cached.begin(), groups_[0].cached.end()};
}

int32_t KvCacheManager::DropFreeCachedBlocks() {
  std::vector<BlockId> drop;
  for (const Group& group : groups_) {
    for (const auto& [hash, id] : group.cached) {
      if (pool_.ref_count(id) == 0) drop.push_back(id);
    }
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
    if (static_cast<int32_t>(i) < n_loaded && prefix_caching_ &&
        !groups_[0].cached.contains(hashes[i])) {
      groups_[0].cached.emplace(hashes[i], id);
      block_hash_[id.value] = hashes[i];
      block_cached_[id.value] = true;
      block_group_[id.value] = 0;
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

size_t KvCacheManager::MatchBlocks(std::span<const BlockHash> hashes, size_t usable) const {
  // Every full-attention group needs each block from the start: the shortest of their
  // prefixes bounds the hit. A sliding-window group then needs, for a hit of L blocks, the
  // blocks its window reads before position L * block_size: the longest L all of them accept.
  auto cached = [&](const Group& group, size_t i) { return group.cached.contains(hashes[i]); };
  size_t limit = usable;
  for (const Group& group : groups_) {
    if (group.spec.sliding()) continue;
    size_t n = 0;
    while (n < limit && cached(group, n)) ++n;
    limit = n;
  }
  for (size_t n = limit; n > 0; --n) {
    bool ok = true;
    for (const Group& group : groups_) {
      if (!group.spec.sliding()) continue;
      const int32_t pos = static_cast<int32_t>(n) * block_size_;
      for (size_t i = static_cast<size_t>(group.spec.FirstKey(pos) / block_size_); ok && i < n;
           ++i) {
        ok = cached(group, i);
      }
      if (!ok) break;
    }
    if (ok) return n;
  }
  return 0;
}

PrefixMatch KvCacheManager::Match(std::span<const BlockHash> hashes, int32_t n) const {
  PrefixMatch m;
  if (!prefix_caching_ || n < 1) return m;
  // Whole blocks only, and never the last token's: its logits are needed, so it is computed.
  const size_t usable = std::min(hashes.size(), static_cast<size_t>((n - 1) / block_size_));
  const size_t hit = MatchBlocks(hashes, usable);
  m.group_blocks.resize(groups_.size() - 1);
  for (size_t g = 0; g < groups_.size(); ++g) {
    const Group& group = groups_[g];
    std::vector<BlockId>& blocks = g == 0 ? m.blocks : m.group_blocks[g - 1];
    const size_t first = static_cast<size_t>(
        group.spec.FirstKey(static_cast<int32_t>(hit) * block_size_) / block_size_);
    for (size_t i = 0; i < hit; ++i) {
      if (i < first) {  // outside the window of every position from the hit on
        blocks.push_back(kNullBlock);
        continue;
      }
      const BlockId id = group.cached.at(hashes[i]);
      blocks.push_back(id);
      m.n_free += pool_.ref_count(id) == 0 ? 1 : 0;
    }
  }
  m.hashes.assign(hashes.begin(), hashes.begin() + static_cast<ptrdiff_t>(hit));
  m.n_tokens = static_cast<int32_t>(hit) * block_size_;
  return m;
}

PrefixMatch KvCacheManager::Match(const int32_t* tokens, int32_t n, const BlockHash& key) const {
  std::vector<BlockHash> hashes;
  if (n >= 1) HashFullBlocks(tokens, n - 1, key, &hashes);  // the blocks a match may use
  return Match(hashes, n);
}

void KvCacheManager::AdoptPrefix(SeqId seq, const PrefixMatch& match) {
  KVS_CHECK(!Contains(seq));
  KVS_CHECK(match.group_blocks.size() + 1 == groups_.size() || match.blocks.empty());
  for (size_t g = 0; g < groups_.size(); ++g) {
    BlockTable& t = groups_[g].tables[seq];
    const std::vector<BlockId>& blocks =
        g == 0 || match.blocks.empty() ? match.blocks : match.group_blocks[g - 1];
    for (BlockId id : blocks) {
      if (id != kNullBlock) KVS_CHECK(pool_.Acquire(id).ok());
    }
    t.blocks = blocks;
    t.hashes = match.hashes;
    t.num_tokens = match.n_tokens;
  }
}

void KvCacheManager::CommitFullBlocks(SeqId seq, std::span<const BlockHash> hashes,
                                      int32_t n_computed, std::span<const int32_t> tokens) {
  const size_t bs = static_cast<size_t>(block_size_);
  if (!prefix_caching_) return;
  for (size_t g = 0; g < groups_.size(); ++g) {
    Group& group = groups_[g];
    auto it = group.tables.find(seq);
    if (it == group.tables.end()) return;
    BlockTable& t = it->second;
    if (t.compacted) return;
    const size_t full = std::min(
        static_cast<size_t>(std::min(n_computed, t.num_tokens) / block_size_), hashes.size());
    while (t.hashes.size() < full) {
      const size_t i = t.hashes.size();
      const BlockHash h = hashes[i];
      t.hashes.push_back(h);
      const BlockId id = t.blocks[i];
      // The first block computed for a hash is the cached one; a duplicate stays private. A
      // block a sliding window already released is not the table's to index.
      if (id == kNullBlock || block_cached_[id.value] || group.cached.contains(h)) continue;
      group.cached.emplace(h, id);
      block_hash_[id.value] = h;
      block_cached_[id.value] = true;
      block_group_[id.value] = static_cast<uint8_t>(g);
      if (g != 0) continue;  // the listeners follow the first group's index
      Indexed(
          id, h, i == 0 ? BlockHash{} : hashes[i - 1],
          tokens.size() >= (i + 1) * bs ? tokens.subspan(i * bs, bs) : std::span<const int32_t>());
    }
  }
}

void KvCacheManager::GrowTable(BlockTable& t, int32_t n_new, std::span<const BlockId> fresh,
                               size_t* next, std::vector<BlockCopy>* copies) {
  const int32_t need = GroupBlocksToAppend(t, n_new);
  const size_t end = *next + static_cast<size_t>(need);
  if (LastBlockNeedsCopy(t)) {
    BlockId& last = t.blocks[(t.num_tokens - 1) / block_size_];
    copies->push_back({last, fresh[*next]});
    const BlockId shared = last;
    last = fresh[(*next)++];
    KVS_CHECK(pool_.Free({&shared, 1}).ok());  // others still hold it: only the count drops
  }
  t.blocks.insert(t.blocks.end(), fresh.begin() + static_cast<ptrdiff_t>(*next),
                  fresh.begin() + static_cast<ptrdiff_t>(end));
  *next = end;
  t.num_tokens += n_new;
}

void KvCacheManager::ReleaseBeforeWindow(const KvGroupSpec& spec, BlockTable& t, int32_t pos) {
  // Blocks wholly before the first key of the query at pos, and so of every later one (a
  // rollback of drafts never goes back past pos, the first new position of this Append).
  const size_t first = static_cast<size_t>(spec.FirstKey(pos) / block_size_);
  std::vector<BlockId> release;
  for (size_t i = 0; i < std::min(first, t.blocks.size()); ++i) {
    if (t.blocks[i] == kNullBlock) continue;
    release.push_back(t.blocks[i]);
    t.blocks[i] = kNullBlock;
  }
  // Oldest first into the free list: the pool reuses them first.
  if (!release.empty()) KVS_CHECK(pool_.Free(release).ok());
}

bool KvCacheManager::Append(SeqId seq, int32_t n_new, std::vector<BlockCopy>* copies) {
  KVS_CHECK(n_new >= 0);
  if (n_new == 0) {
    for (Group& group : groups_) group.tables.try_emplace(seq);
    return true;
  }
  const int32_t need = BlocksToAppend(seq, n_new);
  std::vector<BlockId> fresh;
  if (!AllocateBlocks(need, &fresh)) return false;
  size_t next = 0;
  for (Group& group : groups_) {
    BlockTable& t = group.tables[seq];
    const int32_t first_new = t.num_tokens;
    GrowTable(t, n_new, fresh, &next, copies);
    if (group.spec.sliding()) ReleaseBeforeWindow(group.spec, t, first_new);
  }
  return true;
}

int32_t KvCacheManager::BlocksToReserve(SeqId seq, int32_t n_positions) const {
  int32_t need = 0;
  for (int32_t g = 0; g < num_groups(); ++g) {
    need += std::max(0, BlocksFor(n_positions) - static_cast<int32_t>(Table(seq, g).blocks.size()));
  }
  return need;
}

bool KvCacheManager::Reserve(SeqId seq, int32_t n_positions) {
  std::vector<BlockId> fresh;
  if (!AllocateBlocks(BlocksToReserve(seq, n_positions), &fresh)) return false;
  auto from = fresh.begin();
  for (Group& group : groups_) {
    BlockTable& t = group.tables[seq];
    const auto n = std::max<ptrdiff_t>(0, BlocksFor(n_positions) - std::ssize(t.blocks));
    t.blocks.insert(t.blocks.end(), from, from + n);
    from += n;
  }
  return true;
}

int64_t KvCacheManager::Slot(SeqId seq, int32_t pos, int32_t g) const {
  const BlockTable& t = Table(seq, g);
  KVS_CHECK(pos >= 0 && pos < t.num_tokens);
  const BlockId block = t.blocks[pos / block_size_];
  KVS_CHECK(block != kNullBlock);
  return static_cast<int64_t>(block.value) * block_size_ + pos % block_size_;
}

Status KvCacheManager::Fork(SeqId parent, SeqId child) {
  if (!Contains(parent))
    return Status::Error(StrFormat("fork: no sequence %lld", (long long)parent.value));
  if (Contains(child)) {
    return Status::Error(StrFormat("fork: sequence %lld already exists", (long long)child.value));
  }
  for (Group& group : groups_) {
    // Only the blocks holding positions are shared; blocks reserved past them (a
    // contiguous-style reservation) stay the parent's, or both would write them.
    BlockTable copy = group.tables.at(parent);  // copied before emplace: it may rehash
    copy.blocks.resize(std::min<size_t>(copy.blocks.size(), BlocksFor(copy.num_tokens)));
    for (BlockId id : copy.blocks) {
      if (id != kNullBlock) KVS_RETURN_IF_ERROR(pool_.Ref(id));
    }
    group.tables.emplace(child, std::move(copy));
  }
  return Status::Ok();
}

void KvCacheManager::FreeBlocks(std::vector<BlockId>& blocks) {
  std::erase(blocks, kNullBlock);
  std::reverse(blocks.begin(), blocks.end());
  KVS_CHECK(pool_.Free(blocks).ok());
}

void KvCacheManager::Free(SeqId seq) {
  for (Group& group : groups_) {
    auto it = group.tables.find(seq);
    if (it == group.tables.end()) continue;
    FreeBlocks(it->second.blocks);
    group.tables.erase(it);
  }
}

Status KvCacheManager::Truncate(SeqId seq, int32_t n_tokens) {
  const BlockTable& held = Table(seq);
  if (n_tokens < 0 || n_tokens > held.num_tokens) {
    return Status::Error(StrFormat("truncate: sequence %lld holds %d positions, not %d",
                                   (long long)seq.value, held.num_tokens, n_tokens));
  }
  // A sliding window released the blocks before its window: a rollback may not go back to
  // where the next position's query would read them (nor write into a released block).
  for (const Group& group : groups_) {
    const BlockTable& t = Table(seq, static_cast<int32_t>(&group - groups_.data()));
    const size_t keep = std::min(t.blocks.size(), static_cast<size_t>(BlocksFor(n_tokens + 1)));
    for (size_t i = static_cast<size_t>(group.spec.FirstKey(n_tokens) / block_size_); i < keep;
         ++i) {
      if (t.blocks[i] == kNullBlock) {
        return Status::Error(
            StrFormat("truncate: sequence %lld's window released the blocks position %d would read",
                      (long long)seq.value, n_tokens));
      }
    }
  }
  for (Group& group : groups_) {
    auto it = group.tables.find(seq);
    if (it == group.tables.end()) continue;  // empty, truncated to 0
    BlockTable& t = it->second;
    // Every block past the new end goes, reserved ones (Reserve) included: a reservation past
    // a rollback is dropped, as the positions it was for are.
    const size_t keep = static_cast<size_t>(BlocksFor(n_tokens));
    if (t.blocks.size() > keep) {
      std::vector<BlockId> tail(t.blocks.begin() + static_cast<ptrdiff_t>(keep), t.blocks.end());
      FreeBlocks(tail);
      t.blocks.resize(keep);
    }
    t.num_tokens = n_tokens;
    const size_t full = static_cast<size_t>(n_tokens / block_size_);
    if (t.hashes.size() > full) t.hashes.resize(full);
    // A kept block that is now partial will be written from n_tokens on: out of the index.
    if (keep > full && t.blocks[full] != kNullBlock) Uncache(t.blocks[full]);
  }
  return Status::Ok();
}

Status KvCacheManager::Compact(SeqId seq, int32_t first_rewritten, int32_t n_slots) {
  if (num_groups() != 1) {
    return Status::Error("compact: token eviction needs a model with one KV cache group");
  }
  auto it = groups_[0].tables.find(seq);
  if (it == groups_[0].tables.end()) {
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

Status KvCacheManager::VerifyGroup(const Group& group, std::vector<int32_t>* holders) const {
  for (const auto& [seq, t] : group.tables) {
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
      // Only a sliding window releases blocks, and never the one the next position writes.
      const bool released = id == kNullBlock && group.spec.sliding() &&
                            static_cast<int64_t>(i + 1) * block_size_ <= t.num_tokens;
      if (released) continue;
      if (id <= kNullBlock || id.value >= pool_.num_blocks()) {
        return Status::Error(StrFormat("sequence %lld holds invalid block %d", s, id.value));
      }
      ++(*holders)[id.value];
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
  return Status::Ok();
}

Status KvCacheManager::VerifyIntegrity() const {
  KVS_RETURN_IF_ERROR(pool_.VerifyIntegrity());
  std::vector<int32_t> holders(static_cast<size_t>(pool_.num_blocks()), 0);
  for (const Group& group : groups_) KVS_RETURN_IF_ERROR(VerifyGroup(group, &holders));
  size_t indexed = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    for (const auto& [hash, id] : groups_[g].cached) {
      if (id <= kNullBlock || id.value >= pool_.num_blocks() || !block_cached_[id.value] ||
          !(block_hash_[id.value] == hash) || block_group_[id.value] != g) {
        return Status::Error(
            StrFormat("prefix index entry for block %d disagrees with the block", id.value));
      }
    }
    indexed += groups_[g].cached.size();
  }
  int64_t marked = 0;
  for (bool c : block_cached_) marked += c ? 1 : 0;
  if (marked != static_cast<int64_t>(indexed)) {
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
