// Perplexity under token eviction (`perplexity --kv-budget`): scores a chunk from a cache evicted
// exactly as generation evicts it. The chunk's first half is one prefill (its last logits row
// computed from the whole prefix, as a request's first token is), then the Evictor runs as at
// the end of a prefill, and the scored half is decoded token by token, the Evictor running after
// each step as the engine's does. Same runner, cache manager and Evictor as the engine.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "engine/evictor.h"
#include "engine/model_runner.h"
#include "engine/perplexity.h"
#include "engine/step_batch_builder.h"
#include "kv/kv_cache_manager.h"

namespace kvs {

class EvictingChunkRunner {
 public:
  static Expected<std::unique_ptr<EvictingChunkRunner>> Make(const Model& model, ThreadPool& pool,
                                                             const PerplexityOptions& options,
                                                             int32_t n_ctx);

  // chunk[n_ctx]: writes logits[n_ctx - first - 1][n_vocab], the rows of positions
  // first..n_ctx-2 (each predicting the token after it).
  Status Run(const std::vector<int32_t>& chunk, int32_t first, float* logits);

  // The mean share of each scored row's positions that were still cached, in percent.
  double kept_pct() const { return n_rows_ > 0 ? 100.0 * kept_sum_ / n_rows_ : 100.0; }
  int64_t evicted_tokens() const { return evicted_; }

 private:
  EvictingChunkRunner(std::unique_ptr<ModelRunner> runner, int32_t n_blocks, int32_t block_size,
                      std::unique_ptr<Evictor> evictor);
  // Computes seq's pending tokens in one run with one logits row; then evicts when due.
  Status Step(Sequence* seq, bool end_of_prefill, float* logits);

  std::unique_ptr<ModelRunner> runner_;
  KvCacheManager kv_;
  std::unique_ptr<Evictor> evictor_;
  StepBatchBuilder batch_builder_;
  StepBatch batch_;
  StepOutput output_;
  int64_t next_seq_ = 1;
  double kept_sum_ = 0;
  int64_t n_rows_ = 0, evicted_ = 0;
};

}  // namespace kvs
