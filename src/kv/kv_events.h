// KV cache events for KV-aware routers (issue #22): what the RAM pool stores and removes, in the
// wire format of vLLM's vllm/distributed/kv_events.py, so that a router built for vLLM (llm-d,
// Dynamo, vLLM's own subscriber example) can index kvserve replicas the same way.
//
// The engine calls a KvEventSink once per step with that step's events, in the order the pool
// performed them; a sink never blocks the step (ZmqKvEventPublisher in kv/zmq_event_publisher.h
// queues them for a thread of its own). This file has the event types, the msgpack encoding of a
// batch and its decoding (tests and tools), and no transport.
//
// Wire format (msgpack; the "array-like" form that vLLM's published subscriber example and the
// routers decode; every struct is an array of its fields in declaration order, and an event's
// first element is its type's name):
//   batch            [ts: float64 seconds since the epoch, events: array, data_parallel_rank: int]
//                    (the rank is left out, a 2-element array, when the publisher has none)
//   BlockStored      ["BlockStored", block_hashes: array, parent_block_hash: hash | nil,
//                     token_ids: array of int, block_size: int, lora_id: nil, medium: str | nil]
//   BlockRemoved     ["BlockRemoved", block_hashes: array, medium: str | nil]
//   AllBlocksCleared ["AllBlocksCleared"]
// Recent vLLM releases encode events as tagged maps ({"type": "BlockStored", ...}) and have
// grown optional trailing fields (lora_name, extra_keys, group_idx, ...); the array form here is
// the one the routers' decoders and vLLM's example accept, and tools/kv_events_subscriber.py
// reads both.
//
// Block hashes are 16-byte msgpack bin: hi as 8 bytes big-endian, then lo as 8 bytes big-endian,
// so the bytes' hex is BlockHashHex (the disk tier's file names, /v1/kv/lookup). vLLM's type for
// a hash on the wire is ExternalBlockHash = bytes | int: int is the older form (Python's
// built-in hash, 64 bits), bytes the form of its default sha256 block hashes, which the routers
// therefore already take. Our hashes are 128-bit XXH3 and a msgpack int holds at most 64 bits:
// an int would have to drop half of each hash, and the events would no longer carry the hashes
// our prefix cache uses (acceptance 4 of the issue), so bytes.
//
// Fields that cannot apply: lora_id is always nil (kvserve has no LoRA adapters); the data
// parallel rank is whatever the publisher is configured with (kvserve runs one engine per
// process; none by default).
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <variant>
#include <vector>

#include "core/status.h"
#include "kv/kv_cache_manager.h"

namespace kvs {

// The medium of a block held in the RAM pool. vLLM says "GPU" for its device pool and "CPU" for
// blocks offloaded to host memory; kvserve's pool is host memory.
inline constexpr const char* kKvMediumCpu = "CPU";

// Blocks that became full, hashed and cached (a chain: each hash's parent is the one before it).
struct KvBlockStored {
  std::vector<BlockHash> hashes;
  std::optional<BlockHash> parent;  // the block before hashes[0]; none at a prompt's start
  std::vector<int32_t> token_ids;   // hashes.size() * block_size tokens, in order
  int32_t block_size = 0;
  std::optional<std::string> medium;  // kKvMediumCpu for the RAM pool; none leaves it nil
  bool operator==(const KvBlockStored&) const = default;
};

// Cached blocks whose hash left the pool (a free block reused for other tokens, eviction).
struct KvBlockRemoved {
  std::vector<BlockHash> hashes;
  std::optional<std::string> medium;
  bool operator==(const KvBlockRemoved&) const = default;
};

// Every cached block is gone (a prefix cache reset); a subscriber empties its index.
struct KvAllBlocksCleared {
  bool operator==(const KvAllBlocksCleared&) const = default;
};

using KvEvent = std::variant<KvBlockStored, KvBlockRemoved, KvAllBlocksCleared>;

// One batch as it travels: a timestamp, a step's events, the publisher's data parallel rank.
struct KvEventBatch {
  double ts = 0;
  std::vector<KvEvent> events;
  std::optional<int32_t> dp_rank;
  bool operator==(const KvEventBatch&) const = default;
};

// The 16 bytes a hash travels as: hi big-endian, then lo big-endian.
std::array<uint8_t, 16> KvEventHashBytes(const BlockHash& hash);

// The msgpack bytes of a batch (the format above).
std::vector<uint8_t> EncodeKvEventBatch(double ts, std::span<const KvEvent> events,
                                        std::optional<int32_t> dp_rank);

// Decodes a batch in the array form above (for tests and tools). Lenient where the format lets
// vLLM's publishers differ: the rank may be absent or nil, BlockStored's medium and fields past
// it may be absent, and a hash may be an unsigned int (read as {lo = value, hi = 0}). Anything
// else unexpected (another type, a bin hash that is not 16 bytes, an unknown event) is an error.
Expected<KvEventBatch> DecodeKvEventBatch(std::span<const uint8_t> bytes);

// Where the engine hands each step's events. Publish never blocks and never fails: a sink that
// cannot keep up drops and counts. An empty vector publishes nothing (no batch, no sequence
// number), as vLLM publishes only steps with events.
class KvEventSink {
 public:
  virtual ~KvEventSink() = default;
  virtual void Publish(std::vector<KvEvent> events) = 0;
};

// Keeps every batch published, for tests of what the engine emits (exact hashes, order, exactly
// once) without a socket. Thread-safe.
class KvEventRecorder final : public KvEventSink {
 public:
  void Publish(std::vector<KvEvent> events) override;
  std::vector<std::vector<KvEvent>> batches() const;
  // All events of all batches, in order.
  std::vector<KvEvent> events() const;
  void Clear();

 private:
  mutable std::mutex mu_;
  std::vector<std::vector<KvEvent>> batches_;
};

}  // namespace kvs
