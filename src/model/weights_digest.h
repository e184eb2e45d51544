// The digest of a model file: XXH3-128 over 64 MiB chunks hashed in parallel, then over the
// chunks' digests in order. The chunking fixes the value (not the thread count), so every
// machine computes the same digest for the same bytes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/digest.h"

namespace kvs {

inline constexpr size_t kDigestChunkBytes = size_t{64} << 20;

Digest128 DigestFileBytes(const uint8_t* data, size_t size);

}  // namespace kvs
