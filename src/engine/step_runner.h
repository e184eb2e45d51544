// What executes a step: the model runner, or a fake in the scheduler tests. The seam a second
// backend implements: everything it is given and gives back is plain data (step_batch.h).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/ids.h"
#include "core/status.h"
#include "engine/step_batch.h"
#include "kv/compaction.h"
#include "kv/kv_group.h"

namespace kvs {

// The keys a runner can read back for token eviction: [slot][n_head_kv][head_dim] per layer.
struct KvKeyShape {
  int32_t n_layer = 0;
  int32_t n_head_kv = 0;
  int32_t head_dim = 0;
};

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  virtual int32_t n_vocab() const = 0;
  // The KV cache groups of the model's layers (kv/kv_group.h): a StepRun carries one table per
  // group, in this order. Today's models, and fakes: one full-attention group.
  virtual std::vector<KvGroupSpec> kv_groups() const { return {KvGroupSpec{}}; }
  // Copies blocks (all layers), src to dst in order. Execute does its step's copies itself; the
  // engine calls this first only when a drafter must see the copied blocks before the pass.
  virtual Status CopyBlocks(std::span<const BlockCopy> copies) = 0;
  // The share of a decode step of a sequence at n_context positions that is its KV reads
  // (weights the rest): what each more position of a verification costs again, as attention
  // reads the keys once per tile of queries. 0 for a runner without a model.
  virtual double KvShareAt(int32_t n_context) const { return 0.0; }
  // Forgets the released sequences, applies the runs' block-table changes, copies blocks,
  // computes every run, and fills out: the logits of every run's last n_logits positions, and
  // the attention mass of the runs that observe it (token eviction's h2o and snapkv).
  virtual Status Execute(const StepBatch& step, StepOutput* out) = 0;

  // Token eviction (engine/evictor.h). A runner that cannot evict keeps these defaults.
  virtual KvKeyShape key_shape() const { return {}; }
  // keys[n_slots][n_head_kv][head_dim]: one layer's keys of a sequence's first n_slots slots as
  // the model wrote them (after RoPE), read through its block table. slot_positions: the
  // position of the key in each slot, or empty when slot i holds position i.
  virtual Status ReadKeys(std::span<const BlockId> table, int32_t n_slots,
                          std::span<const int32_t> slot_positions, int32_t layer,
                          std::span<float> keys) {
    return Status::Error("this runner cannot read keys back");
  }
  // Moves K/V (every layer, as bytes) between the table's logical slots, in order.
  virtual Status MoveSlots(std::span<const BlockId> table, std::span<const SlotMove> moves) {
    return Status::Error("this runner cannot move KV slots");
  }
};

}  // namespace kvs
