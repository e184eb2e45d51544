#include "engine/kv_connectors.h"

#include <algorithm>

#include "core/check.h"

namespace kvs {

KvConnectors::KvConnectors(KvCacheManager& kv) : kv_(kv) {
  kv_.set_uncache_listener([this](BlockId id, const BlockHash& hash, bool reused) {
    for (auto& t : tiers_) {
      t->OnUncache(id, hash, reused);
    }
    if (events_) events_->Removed(hash);
  });
  kv_.set_index_listener([this](BlockId, const BlockHash& hash, const BlockHash& parent,
                                std::span<const int32_t> tokens) {
    if (events_) events_->Stored(hash, parent, tokens);
  });
}

void KvConnectors::AttachTier(std::unique_ptr<KvTier> tier) {
  KVS_CHECK(tiers_.size() < static_cast<size_t>(kMaxTiers));
  tier->set_index(static_cast<int>(tiers_.size()));
  tiers_.push_back(std::move(tier));
}

void KvConnectors::AttachEventSink(KvEventSink* sink) {
  events_ = std::make_unique<KvEventLog>(sink, kv_.block_size());
  // A router may know this replica from before a restart: whatever it indexed is gone.
  events_->AllCleared();
  events_->Flush();
}

KvTier* KvConnectors::tier(std::string_view name) const {
  for (const auto& t : tiers_) {
    if (t->name() == name) return t.get();
  }
  return nullptr;
}

int64_t KvConnectors::Flush(bool wait) {
  int64_t offered = 0;
  for (auto& t : tiers_) {
    offered += t->Flush(kv_, wait);
  }
  return offered;
}

int32_t KvConnectors::ResetPrefixCache() {
  Flush(/*wait=*/false);  // write-back: what leaves RAM goes to the tiers first
  const int32_t dropped = kv_.DropFreeCachedBlocks();
  FlushEvents();
  return dropped;
}

void KvConnectors::BeforePlan(const std::vector<Sequence*>& waiting,
                              const std::function<Sequence*(SeqId)>& find,
                              double compute_seconds_per_token) {
  for (auto& t : tiers_) {
    t->BeforePlan(kv_, waiting, find, compute_seconds_per_token);
  }
}

void KvConnectors::WaitForLoad() {
  for (auto& t : tiers_) {
    if (t->loads_outstanding()) {
      t->WaitForLoad(5);
      break;
    }
  }
}

void KvConnectors::AfterCommit(Sequence& seq) {
  for (auto& t : tiers_) {
    t->AfterCommit(seq, kv_);
  }
}

void KvConnectors::FillTierTokens(const Sequence& seq, int32_t cached_tokens,
                                  std::array<int32_t, kMaxTiers>* tier_tokens) const {
  int32_t left = cached_tokens;
  for (size_t i = 0; i < tiers_.size(); ++i) {
    (*tier_tokens)[i] = std::min(seq.tier_tokens[i], left);
    left -= (*tier_tokens)[i];
  }
}

void KvConnectors::FlushEvents() {
  if (events_) events_->Flush();
}

}  // namespace kvs
