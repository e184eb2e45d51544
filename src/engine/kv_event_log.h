// The engine's KV events (issue #22): every change of the RAM prefix index, in the order the pool
// made it, gathered during a step and handed to a KvEventSink (kv/kv_events.h; the ZeroMQ
// publisher, or a recorder in tests) in one batch when the step ends. A block stored is one
// whose computed or loaded KV entered the index under its chain hash; a block removed is one
// that left it (reused by LRU, rewritten, dropped by /reset_prefix_cache). Consecutive stores of
// one chain merge into one BlockStored (as vLLM sends a request's new blocks), consecutive
// removals into one BlockRemoved. Engine thread only.
#pragma once

#include <span>
#include <vector>

#include "kv/kv_events.h"

namespace kvs {

class KvEventLog {
 public:
  KvEventLog(KvEventSink* sink, int32_t block_size) : sink_(sink), block_size_(block_size) {}

  void Stored(const BlockHash& hash, const BlockHash& parent, std::span<const int32_t> tokens);
  void Removed(const BlockHash& hash);
  void AllCleared();
  // Hands what was gathered to the sink (nothing when nothing was).
  void Flush();

 private:
  KvEventSink* sink_;
  int32_t block_size_;
  std::vector<KvEvent> pending_;
};

}  // namespace kvs
