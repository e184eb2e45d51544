#include "kv/kv_cache_manager.h"

#include <algorithm>

#include "core/check.h"

namespace kvs {
namespace {
const BlockTable kEmptyTable;
}  // namespace

KvCacheManager::KvCacheManager(int32_t n_blocks, int32_t block_size, int32_t watermark_blocks)
    : pool_(n_blocks), block_size_(block_size), watermark_(watermark_blocks) {
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

bool KvCacheManager::Append(SeqId seq, int32_t n_new, std::vector<BlockCopy>* copies) {
  KVS_CHECK(n_new >= 0);
  if (n_new == 0) {
    tables_.try_emplace(seq);
    return true;
  }
  const int32_t need = BlocksToAppend(seq, n_new);
  std::vector<int32_t> fresh;
  if (!pool_.Allocate(need, &fresh)) return false;
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
  if (!pool_.Allocate(need, &fresh)) return false;
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
  if (it == tables_.end()) return Status::Error(StrFormat("fork: no sequence %lld", (long long)parent));
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
  for (int32_t id = 1; id < pool_.num_blocks(); ++id) {
    if (holders[id] != pool_.ref_count(id)) {
      return Status::Error(StrFormat("block %d: refcount %d but %d tables hold it", id,
                                     pool_.ref_count(id), holders[id]));
    }
  }
  return Status::Ok();
}

}  // namespace kvs
