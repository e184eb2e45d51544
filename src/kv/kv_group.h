// KV cache groups (vLLM v1's KV cache groups): the layers of a model that share one kind of
// attention share one block table per sequence. A full-attention group keeps every block of a
// sequence; a sliding-window group's queries see only the last `window` positions, so
//   its eviction rule: as a sequence grows, blocks wholly before every later query's window go
//     back to the pool (their table entries become the null block), keeping their hashes for
//     prefix hits until the pool hands them out again;
//   its prefix-hit rule: a cached prefix of L blocks is usable when the blocks the window
//     before position L * block_size reads are cached, not every block from the start.
// One block pool serves every group, and the prefix index is kept per group (the same chain
// hash names a block of each group's layers).
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>

namespace kvs {

struct KvGroupSpec {
  int32_t window = 0;  // 0: full attention; else the positions a query sees, itself included

  bool sliding() const { return window > 0; }
  // The first position a query at `pos` reads.
  int32_t FirstKey(int32_t pos) const { return sliding() && pos >= window ? pos - window + 1 : 0; }
  bool operator==(const KvGroupSpec&) const = default;
};

// The most blocks one sequence of `positions` positions holds at once, fed in chunks of at most
// max_chunk tokens, over every group: a full group's cover every position, a sliding window's
// its window and a chunk (and a block each side that either may straddle), if fewer.
inline int64_t PeakBlocks(std::span<const KvGroupSpec> groups, int64_t positions,
                          int32_t block_size, int32_t max_chunk) {
  const int64_t all = (positions + block_size - 1) / block_size;
  int64_t n = 0;
  for (const KvGroupSpec& g : groups) {
    const int64_t window =
        (static_cast<int64_t>(g.window) + max_chunk + block_size - 1) / block_size + 2;
    n += g.sliding() ? std::min(all, window) : all;
  }
  return n;
}

// Whether a model of these groups has a sliding-window layer: what reads or moves a sequence's KV
// through one table, or by slot (token eviction, drafters, tiers), does not work with it yet.
inline bool AnySliding(std::span<const KvGroupSpec> groups) {
  return std::any_of(groups.begin(), groups.end(),
                     [](const KvGroupSpec& g) { return g.sliding(); });
}

}  // namespace kvs
