// Makes a StepBatch (step_batch.h) from the scheduler's plan: the runs' tokens, positions and
// slots, each sequence's block-table changes since the batch it was last in, the tokens of
// sequences the runner has not seen, and the attention mass token eviction observes. The one
// place the engine's sequences and block tables become a runner's plain data.
#pragma once

#include <span>
#include <unordered_map>
#include <vector>

#include "engine/request.h"
#include "engine/scheduler.h"
#include "engine/step_batch.h"
#include "kv/kv_cache_manager.h"

namespace kvs {

class StepBatchBuilder {
 public:
  // Fills batch (cleared first) with runs over kv's tables, already grown for the step, and
  // copies to do first. Sequence::n_computed is still the count before the step.
  void Build(std::span<const ScheduledRun> runs, std::span<const BlockCopy> copies,
             const KvCacheManager& kv, StepBatch* batch);
  // Run `run` of batch forks a choice: its sequence id (reserved by the engine) and sampling.
  void AddFork(size_t run, SeqId child, const StepSampling& sampling, StepBatch* batch);
  // The sequence is gone: the next batch tells the runner to forget it.
  void Release(SeqId seq);

 private:
  void AddRun(const ScheduledRun& run, const KvCacheManager& kv, StepBatch* batch);

  // What the runner was last told of each sequence's table, to send only what changed.
  std::unordered_map<SeqId, std::vector<std::vector<BlockId>>> sent_;  // [n_groups] tables
  std::vector<int64_t> released_;
};

}  // namespace kvs
