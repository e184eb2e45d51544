// What joins the RAM prefix cache to the world past it: the tiers under it (kv_tier.h; asked in
// the order attached: the builder attaches disk, then Redis) and the KV events of its index
// (kv_event_log.h, for KV-aware routers). The engine drives them at fixed points of a step
// (the hooks below); the API, the CLI and tests reach them through Engine::connectors().
// Single-threaded: the engine's thread (AsyncEngine::RunOnLoop from elsewhere).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "engine/kv_event_log.h"
#include "engine/kv_tier.h"
#include "engine/request.h"
#include "kv/kv_cache_manager.h"

namespace kvs {

class KvConnectors {
 public:
  // Listens to kv's prefix index (uncached blocks, indexed blocks); kv outlives this.
  explicit KvConnectors(KvCacheManager& kv);
  KvConnectors(const KvConnectors&) = delete;
  KvConnectors& operator=(const KvConnectors&) = delete;

  // A tier under the prefix cache, asked after those attached before it. Attach before the
  // engine's first step; at most kMaxTiers.
  void AttachTier(std::unique_ptr<KvTier> tier);
  // Publishes every change of the prefix index to sink (null: none), starting with
  // AllBlocksCleared. The sink outlives this. Attach before the first step.
  void AttachEventSink(KvEventSink* sink);
  // The tiers, in the order they are asked; a TokenEvent's tier_tokens follow it.
  const KvTiers& tiers() const { return tiers_; }
  // The tier labelled name ("disk", "redis"); null: none.
  KvTier* tier(std::string_view name) const;
  // Writes every indexed block a tier lacks; when wait, waits for the writes (bounded: each
  // tier's flush timeout). SIGTERM's last act. Returns the blocks offered.
  int64_t Flush(bool wait);
  // Drops the prefix cache's blocks nobody holds (vLLM's /reset_prefix_cache; under write-back
  // they are offered to the tiers first). Returns how many were dropped.
  int32_t ResetPrefixCache();

  // --- The engine's hooks, in a step's order.
  // Before planning: finished loads enter the prefix index, new loads start for waiting
  // sequences (kv_tier.h BeforePlan; find: a live sequence by id, or null).
  void BeforePlan(const std::vector<Sequence*>& waiting,
                  const std::function<Sequence*(SeqId)>& find, double compute_seconds_per_token);
  // Nothing to compute but a tier's load: waits for it (briefly) rather than spin.
  void WaitForLoad();
  // seq committed blocks: every tier offers them for writing.
  void AfterCommit(Sequence& seq);
  // Each tier's loaded tokens for an event of seq, capped in lookup order so that together they
  // never exceed cached_tokens (a preempted sequence's reload counts once).
  void FillTierTokens(const Sequence& seq, int32_t cached_tokens,
                      std::array<int32_t, kMaxTiers>* tier_tokens) const;
  // The step's changes of the prefix index go out as one batch (nothing without a sink).
  void FlushEvents();

 private:
  KvCacheManager& kv_;
  KvTiers tiers_;
  std::unique_ptr<KvEventLog> events_;  // null: no KV events
};

}  // namespace kvs
