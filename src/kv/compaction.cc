#include "kv/compaction.h"

namespace kvs {

Expected<CompactionPlan> PlanCompaction(std::span<const int32_t> kept,
                                        std::span<const int32_t> positions, int32_t block_size,
                                        int32_t frozen) {
  const int32_t n_slots = static_cast<int32_t>(positions.size());
  if (block_size <= 0) return Status::Error("compaction: block size must be positive");
  if (frozen < 0 || frozen > n_slots) {
    return Status::Error(StrFormat("compaction: %d frozen slots of %d", frozen, n_slots));
  }
  // Every frozen slot is kept (kept[i] == i for i < frozen, checked below): a list that ends
  // inside the frozen prefix would drop shared slots and free a shared block.
  if (static_cast<int64_t>(kept.size()) < frozen) {
    return Status::Error(
        StrFormat("compaction: %d slots kept, but the first %d are shared and "
                  "must all be kept",
                  static_cast<int32_t>(kept.size()), frozen));
  }
  CompactionPlan plan;
  int32_t previous = -1;
  for (size_t i = 0; i < kept.size(); ++i) {
    const int32_t src = kept[i];
    if (src <= previous || src >= n_slots) {
      return Status::Error(
          StrFormat("compaction: kept slots must be ascending and below %d (slot %d after %d)",
                    n_slots, src, previous));
    }
    previous = src;
    const int32_t dst = static_cast<int32_t>(i);
    if (dst < frozen && src != dst) {
      return Status::Error(
          StrFormat("compaction: slot %d is shared (below %d) and must be kept", dst, frozen));
    }
    if (src != dst) plan.moves.push_back({src, dst});
    plan.positions.push_back(positions[src]);
  }
  plan.n_slots = static_cast<int32_t>(kept.size());
  auto blocks = [&](int32_t slots) {
    return static_cast<int32_t>((int64_t{slots} + block_size - 1) / block_size);
  };
  const int32_t blocks_before = blocks(n_slots);
  plan.n_blocks = blocks(plan.n_slots);
  plan.n_freed_blocks = blocks_before - plan.n_blocks;
  return plan;
}

}  // namespace kvs
