// What executes a step's plan: the model runner, or a fake in the scheduler tests.
#pragma once

#include <cstdint>
#include <span>

#include "core/status.h"
#include "engine/scheduler.h"
#include "kv/compaction.h"
#include "kv/kv_cache_manager.h"

namespace kvs {

struct StepInput {
  std::span<const ScheduledRun> runs;  // Sequence::n_computed is still the count before the step
  std::span<const BlockCopy> copies;   // to do before anything is computed
  const KvCacheManager* kv = nullptr;  // block tables, already grown for this step
};

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
  // Copies blocks (all layers), src to dst in order. Execute does its step's copies itself; the
  // engine calls this first only when a drafter must see the copied blocks before the pass.
  virtual Status CopyBlocks(std::span<const BlockCopy> copies) = 0;
  // The share of a decode step of a sequence at n_context positions that is its KV reads
  // (weights the rest): what each more position of a verification costs again, as attention
  // reads the keys once per tile of queries. 0 for a runner without a model.
  virtual double KvShareAt(int32_t n_context) const { return 0.0; }
  // Copies blocks, computes every run, and writes logits[sum of n_logits][n_vocab]: each run's
  // rows, for its last n_logits positions, in run order.
  // Also adds the attention observed queries give each slot to Sequence::attention_mass for
  // sequences with observe_attention (token eviction's h2o and snapkv).
  virtual Status Execute(const StepInput& step, float* logits) = 0;

  // Token eviction (engine/evictor.h). A runner that cannot evict keeps these defaults.
  virtual KvKeyShape key_shape() const { return {}; }
  // keys[seq.n_slots()][n_head_kv][head_dim]: one layer's keys of the sequence's cached slots
  // as the model wrote them (after RoPE), read through table.
  virtual Status ReadKeys(const Sequence& seq, const BlockTable& table, int32_t layer,
                          std::span<float> keys) {
    return Status::Error("this runner cannot read keys back");
  }
  // Moves K/V (every layer, as bytes) between the table's logical slots, in order.
  virtual Status MoveSlots(const BlockTable& table, std::span<const SlotMove> moves) {
    return Status::Error("this runner cannot move KV slots");
  }
};

}  // namespace kvs
