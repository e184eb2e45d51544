#include "engine/kv_event_log.h"

namespace kvs {

void KvEventLog::Stored(const BlockHash& hash, const BlockHash& parent,
                        std::span<const int32_t> tokens) {
  if (!pending_.empty()) {
    if (auto* last = std::get_if<KvBlockStored>(&pending_.back());
        last && last->hashes.back() == parent) {
      last->hashes.push_back(hash);
      last->token_ids.insert(last->token_ids.end(), tokens.begin(), tokens.end());
      return;
    }
  }
  KvBlockStored e;
  e.hashes = {hash};
  if (!(parent == BlockHash{})) e.parent = parent;
  e.token_ids.assign(tokens.begin(), tokens.end());
  e.block_size = block_size_;
  e.medium = kKvMediumCpu;
  pending_.push_back(std::move(e));
}

void KvEventLog::Removed(const BlockHash& hash) {
  if (!pending_.empty()) {
    if (auto* last = std::get_if<KvBlockRemoved>(&pending_.back())) {
      last->hashes.push_back(hash);
      return;
    }
  }
  KvBlockRemoved e;
  e.hashes = {hash};
  e.medium = kKvMediumCpu;
  pending_.push_back(std::move(e));
}

void KvEventLog::AllCleared() {
  pending_.push_back(KvAllBlocksCleared{});
}

void KvEventLog::Flush() {
  if (pending_.empty()) return;
  sink_->Publish(std::move(pending_));
  pending_.clear();
}

}  // namespace kvs
