// What executes a step's plan: the model runner, or a fake in the scheduler tests.
#pragma once

#include <cstdint>
#include <span>

#include "core/status.h"
#include "engine/scheduler.h"
#include "kv/kv_cache_manager.h"

namespace kvs {

struct StepInput {
  std::span<const ScheduledRun> runs;  // Sequence::n_computed is still the count before the step
  std::span<const BlockCopy> copies;   // to do before anything is computed
  const KvCacheManager* kv = nullptr;  // block tables, already grown for this step
};

// Whether a run needs logits (the scheduler decided: ScheduledRun::n_logits).
inline bool RunSamples(const ScheduledRun& r) {
  return r.n_logits > 0;
}

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
  virtual Status Execute(const StepInput& step, float* logits) = 0;
};

}  // namespace kvs
