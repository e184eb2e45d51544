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

// Whether a run computes its sequence's last known token, whose logits sample the next one.
inline bool RunSamples(const ScheduledRun& r) {
  return r.seq->n_computed + r.n_tokens == static_cast<int32_t>(r.seq->tokens.size());
}

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  virtual int32_t n_vocab() const = 0;
  // Copies blocks, computes every run, and writes logits[sampling runs][n_vocab] in run order.
  virtual Status Execute(const StepInput& step, float* logits) = 0;
};

}  // namespace kvs
