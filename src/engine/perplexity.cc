#include "engine/perplexity.h"

#include <chrono>
#include <cmath>

#include "engine/single_sequence.h"

namespace kvs {

Expected<PerplexityResult> ComputePerplexity(const Model& model, const std::vector<int32_t>& tokens,
                                             int32_t n_ctx, int32_t bos_id, ThreadPool& pool,
                                             const std::function<void(int32_t, double)>& on_chunk) {
  const int32_t n_vocab = model.config().n_vocab;
  if (n_ctx < 4)
    return Status::Error(StrFormat("context %d is too small for perplexity (need >= 4)", n_ctx));
  if (static_cast<int64_t>(tokens.size()) < 2 * static_cast<int64_t>(n_ctx)) {
    return Status::Error(
        StrFormat("the text has %zu tokens; perplexity with a context of %d needs at least %d",
                  tokens.size(), n_ctx, 2 * n_ctx));
  }
  auto t0 = std::chrono::steady_clock::now();
  PerplexityResult r;
  r.n_tokens = static_cast<int64_t>(tokens.size());
  r.n_chunks = static_cast<int32_t>(tokens.size() / n_ctx);
  const int32_t first = n_ctx / 2;
  const int32_t n_scored_per_chunk = n_ctx - 1 - first;

  SingleSequence seq(model, pool, n_ctx);
  std::vector<float> logits(static_cast<size_t>(n_ctx - first) * n_vocab);
  std::vector<int32_t> chunk(n_ctx);
  double nll = 0, nll2 = 0;
  for (int32_t i = 0; i < r.n_chunks; ++i) {
    std::copy(tokens.begin() + static_cast<size_t>(i) * n_ctx,
              tokens.begin() + static_cast<size_t>(i + 1) * n_ctx, chunk.begin());
    if (bos_id >= 0) chunk[0] = bos_id;
    // Logits for positions first..n_ctx-1; the last one predicts past the chunk and is unused.
    KVS_RETURN_IF_ERROR(seq.Run(chunk.data(), n_ctx, 0, n_ctx - first, logits.data()));
    for (int32_t j = 0; j < n_scored_per_chunk; ++j) {
      const float* row = logits.data() + static_cast<size_t>(j) * n_vocab;
      float max = row[0];
      for (int32_t v = 1; v < n_vocab; ++v) max = std::max(max, row[v]);
      double sum = 0;
      for (int32_t v = 0; v < n_vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - max);
      const int32_t target = chunk[first + j + 1];
      double lp = static_cast<double>(row[target]) - max - std::log(sum);
      nll -= lp;
      nll2 += lp * lp;
    }
    r.n_scored += n_scored_per_chunk;
    if (on_chunk) on_chunk(i, std::exp(nll / r.n_scored));
  }
  r.nll = nll / r.n_scored;
  double var = nll2 / r.n_scored - r.nll * r.nll;
  r.nll_stddev = (var > 0 && r.n_scored > 1) ? std::sqrt(var / (r.n_scored - 1)) : 0;
  r.ppl = std::exp(r.nll);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace kvs
