// Chunked perplexity as llama-perplexity computes it: the token stream is cut into chunks
// of n_ctx tokens (each starting with BOS when the model adds one), and every chunk is
// scored on its second half, so each scored token sees at least n_ctx/2 tokens of context.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "model/weights.h"

namespace kvs {

struct PerplexityResult {
  double ppl = 0;
  double nll = 0;         // mean negative log-likelihood (nats per token)
  double nll_stddev = 0;  // standard error of the mean
  int64_t n_tokens = 0;   // tokens in the input
  int32_t n_chunks = 0;
  int64_t n_scored = 0;  // tokens whose probability was scored
  double seconds = 0;
};

// on_chunk(i, running_ppl) is called after each chunk (progress reporting).
Expected<PerplexityResult> ComputePerplexity(
    const Model& model, const std::vector<int32_t>& tokens, int32_t n_ctx, int32_t bos_id,
    ThreadPool& pool, const std::function<void(int32_t, double)>& on_chunk = nullptr);

}  // namespace kvs
