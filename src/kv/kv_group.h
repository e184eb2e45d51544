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

#include <cstdint>

namespace kvs {

struct KvGroupSpec {
  int32_t window = 0;  // 0: full attention; else the positions a query sees, itself included

  bool sliding() const { return window > 0; }
  // The first position a query at `pos` reads.
  int32_t FirstKey(int32_t pos) const { return sliding() && pos >= window ? pos - window + 1 : 0; }
  bool operator==(const KvGroupSpec&) const = default;
};

}  // namespace kvs
