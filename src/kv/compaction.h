// Token eviction, the memory half (issue #19): once a policy has chosen the slots a sequence
// keeps (eviction_policy.h), the kept slots move forward over the evicted ones, in order, so
// that they fill the first blocks of the sequence's table and whole tail blocks come free.
// A move never overtakes its source (dst <= src, ascending), so moving in place is safe and
// the K/V of a slot is read before anything is written over it. The plan is pure bookkeeping
// over the sequence's logical slots; the runner turns it into byte moves (MoveKvSlot) and the
// cache manager returns the freed blocks.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"

namespace kvs {

struct SlotMove {
  int32_t src = 0;  // logical slot of the sequence (block i * block_size + offset)
  int32_t dst = 0;  // dst < src
  bool operator==(const SlotMove&) const = default;
};

struct CompactionPlan {
  std::vector<SlotMove> moves;     // in order; slots that stay where they are do not appear
  std::vector<int32_t> positions;  // [n_kept] the RoPE position of each slot after the moves
  int32_t n_slots = 0;             // slots after compaction (the kept count)
  int32_t n_blocks = 0;            // blocks the table keeps; the blocks after them come free
  int32_t n_freed_blocks = 0;
};

// kept: ascending logical slots of a sequence with n_slots slots in blocks of block_size;
// positions[n_slots]: each slot's RoPE position. Slots below `frozen` (blocks shared with other
// sequences or the prefix cache) must all be kept: they are never rewritten.
Expected<CompactionPlan> PlanCompaction(std::span<const int32_t> kept,
                                        std::span<const int32_t> positions, int32_t block_size,
                                        int32_t frozen = 0);

}  // namespace kvs
