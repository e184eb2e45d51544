// The seam for codecs that re-code a block's KV rather than compress its bytes (issue #23's
// transform codec, engine/transform_codec.h): the block file (block_file.h) stores raw and zstd
// payloads itself and hands a codec's payload to the codec it was given. Such a codec knows the
// KV format (it decodes the pool's bytes to vectors and writes them back in the pool's types)
// and the data it was fitted on, and says in its payload which fit it used, so that a payload of
// another fit (another model, calibration or version) fails to decode: a miss, never wrong data.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace kvs {

class KvBlockCodec {
 public:
  virtual ~KvBlockCodec() = default;
  // "tc:2": for logs and flags.
  virtual std::string name() const = 0;
  // A pool block's bytes (KvStorage::ReadBlock) whose first slot holds RoPE position
  // first_position, coded. Thread-safe (const; the writer's thread calls it).
  virtual Expected<std::vector<uint8_t>> Encode(std::span<const uint8_t> block,
                                                int32_t first_position) const = 0;
  // A payload Encode made back into a pool block's bytes, *block (resized to one block). An
  // error for anything else: another fit, a truncated or corrupted payload.
  virtual Status Decode(std::span<const uint8_t> payload, std::vector<uint8_t>* block) const = 0;
  // Whether payload is a well-formed payload of this codec's kind made with another fit or
  // budget: a store written with other settings, not a damaged one (the tiers then recompute
  // the block without calling it corrupt).
  virtual bool OtherFit(std::span<const uint8_t> payload) const = 0;
};

}  // namespace kvs
