#include "kv/kv_cache_manager.h"

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
  // hash(parent hash, extra key, the block's token ids)
  std::vector<unsigned char> buf(32 + sizeof(int32_t) * static_cast<size_t>(block_size_));
  std::memcpy(buf.data(), &parent, 16);
  std::memcpy(buf.data() + 16, &key, 16);
  std::memcpy(buf.data() + 32, tokens, sizeof(int32_t) * static_cast<size_t>(block_size_));
  const XXH128_hash_t h = XXH3_128bits(buf.data(), buf.size());
  return BlockHash{h.low64, h.high64};
}

KvCacheManager::KvCacheManager(int32_t n_blocks, int32_t block_size, int32_t watermark_blocks)
    : pool_(n_blocks),
      block_size_(block_size),
      watermark_(watermark_blocks),
      block_hash_(static_cast<size_t>(n_blocks)),
      block_cached_(static_cast<size_t>(n_blocks), false) {
  KVS_CHECK(block_size > 0 && watermark_blocks >= 0);
}

const BlockTable& KvCacheManager::Table(SeqId seq) const {
  auto it = tables_.find(seq);
  return it == tables_.end() ? kEmptyTable : it->second;
}

bool KvCacheManager::LastBlockNeedsCopy(const BlockTable& t) const {
  if (t.num_tokens % block_size_ == 0) return false;  // full (or no) last block: never written
  const int32_t last = t.blocks[(t.num_tokens - 1) / block_size_];
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
  for (int32_t id : Table(seq).blocks) n += pool_.ref_count(id) == 1 ? 1 : 0;
  return n;
}

bool KvCacheManager::AllocateBlocks(int32_t n, std::vector<int32_t>* out) {
  const size_t first = out->size();
  if (!pool_.Allocate(n, out)) return false;
  for (size_t i = first; i < out->size(); ++i) {
    const int32_t id = (*out)[i];
    if (block_cached_[id]) {  // the least recently used cached block is the one reused
      cached_.erase(block_hash_[id]);
      block_cached_[id] = false;
    }
  }
  return true;
}

PrefixMatch KvCacheManager::Match(const int32_t* tokens, int32_t n, const BlockHash& key) const {
  PrefixMatch m;
  if (!prefix_caching_) return m;
  BlockHash parent;
  for (int32_t start = 0; start + block_size_ <= n - 1; start += block_size_) {
    const BlockHash h = ChainHash(parent, key, tokens + start);
    auto it = cached_.find(h);
    if (it == cached_.end()) break;
    m.blocks.push_back(it->second);
    m.hashes.push_back(h);
    m.n_free += pool_.ref_count(it->second) == 0 ? 1 : 0;
    m.n_tokens += block_size_;
    parent = h;
  }
  return m;
}

void KvCacheManager::AdoptPrefix(SeqId seq, const PrefixMatch& match) {
  KVS_CHECK(!tables_.contains(seq));
  BlockTable& t = tables_[seq];
  for (int32_t id : match.blocks) KVS_CHECK(pool_.Acquire(id).ok());
  t.blocks = match.blocks;
  t.hashes = match.hashes;
  t.num_tokens = match.n_tokens;
}

void KvCacheManager::CommitFullBlocks(SeqId seq, const int32_t* tokens, int32_t n_computed,
                                      const BlockHash& key) {
  if (!prefix_caching_) return;
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  BlockTable& t = it->second;
  const size_t full = static_cast<size_t>(std::min(n_computed, t.num_tokens) / block_size_);
  while (t.hashes.size() < full) {
    const size_t i = t.hashes.size();
    const BlockHash parent = i == 0 ? BlockHash{} : t.hashes[i - 1];
    const BlockHash h = ChainHash(parent, key, tokens + i * block_size_);
    t.hashes.push_back(h);
    const int32_t id = t.blocks[i];
    // The first block computed for a hash is the cached one; a duplicate stays private.
    if (!block_cached_[id] && !cached_.contains(h)) {
      cached_.emplace(h, id);
      block_hash_[id] = h;
      block_cached_[id] = true;
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
  std::vector<int32_t> fresh;
  if (!AllocateBlocks(need, &fresh)) return false;
  BlockTable& t = tables_[seq];
  size_t next = 0;
  if (LastBlockNeedsCopy(t)) {
    int32_t& last = t.blocks[(t.num_tokens - 1) / block_size_];
    copies->push_back({last, fresh[next]});
    const int32_t shared = last;
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
  std::vector<int32_t> fresh;
  if (!AllocateBlocks(need, &fresh)) return false;
  BlockTable& mt = tables_[seq];
  mt.blocks.insert(mt.blocks.end(), fresh.begin(), fresh.end());
  return true;
}

int64_t KvCacheManager::Slot(SeqId seq, int32_t pos) const {
  const BlockTable& t = Table(seq);
  KVS_CHECK(pos >= 0 && pos < t.num_tokens);
  return static_cast<int64_t>(t.blocks[pos / block_size_]) * block_size_ + pos % block_size_;
}

Status KvCacheManager::Fork(SeqId parent, SeqId child) {
  auto it = tables_.find(parent);
  if (it == tables_.end())
    return Status::Error(StrFormat("fork: no sequence %lld", (long long)parent));
  if (tables_.contains(child)) {
    return Status::Error(StrFormat("fork: sequence %lld already exists", (long long)child));
  }
  // Only the blocks holding positions are shared; blocks reserved past them (a contiguous-style
  // reservation) stay the parent's, or both would write them.
  BlockTable copy = it->second;  // copied before emplace: emplace may rehash and move it
  copy.blocks.resize(std::min<size_t>(copy.blocks.size(), BlocksFor(copy.num_tokens)));
  for (int32_t id : copy.blocks) KVS_RETURN_IF_ERROR(pool_.Ref(id));
  tables_.emplace(child, std::move(copy));
  return Status::Ok();
}

void KvCacheManager::Free(SeqId seq) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  std::vector<int32_t>& blocks = it->second.blocks;
  std::reverse(blocks.begin(), blocks.end());
  KVS_CHECK(pool_.Free(blocks).ok());
  tables_.erase(it);
}

Status KvCacheManager::VerifyIntegrity() const {
  KVS_RETURN_IF_ERROR(pool_.VerifyIntegrity());
  std::vector<int32_t> holders(static_cast<size_t>(pool_.num_blocks()), 0);
  for (const auto& [seq, t] : tables_) {
    if (static_cast<int64_t>(t.num_tokens) > static_cast<int64_t>(t.blocks.size()) * block_size_) {
      return Status::Error(StrFormat("sequence %lld has %d tokens but only %zu blocks",
                                     (long long)seq, t.num_tokens, t.blocks.size()));
    }
    for (int32_t id : t.blocks) {
      if (id <= kNullBlock || id >= pool_.num_blocks()) {
        return Status::Error(StrFormat("sequence %lld holds invalid block %d", (long long)seq, id));
      }
      ++holders[id];
    }
  }
  for (const auto& [hash, id] : cached_) {
    if (id <= kNullBlock || id >= pool_.num_blocks() || !block_cached_[id] ||
        !(block_hash_[id] == hash)) {
      return Status::Error(
          StrFormat("prefix index entry for block %d disagrees with the block", id));
    }
  }
  int64_t marked = 0;
  for (bool c : block_cached_) marked += c ? 1 : 0;
  if (marked != static_cast<int64_t>(cached_.size())) {
    return Status::Error("blocks marked cached differ from the prefix index");
  }
  for (int32_t id = 1; id < pool_.num_blocks(); ++id) {
    if (holders[id] != pool_.ref_count(id)) {
      return Status::Error(StrFormat("block %d: refcount %d but %d tables hold it", id,
                                     pool_.ref_count(id), holders[id]));
    }
  }
  return Status::Ok();
}

}  // namespace kvs
