// Chunked perplexity as llama-perplexity computes it: the token stream is cut into chunks
// of n_ctx tokens (each starting with BOS when the model adds one), and every chunk is
// scored on its second half, so each scored token sees at least n_ctx/2 tokens of context.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "engine/eviction_config.h"
#include "engine/kv_format_factory.h"
#include "kernels/kv_types.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace kvs {

struct PerplexityResult {
  double ppl = 0;
  double nll = 0;         // mean negative log-likelihood (nats per token)
  double nll_stddev = 0;  // standard error of the mean
  int64_t n_tokens = 0;   // tokens in the input
  int32_t n_chunks = 0;
  int64_t n_scored = 0;  // tokens whose probability was scored
  double seconds = 0;
  // With a base run (f32 K/V over the same chunks, side by side): its perplexity, the mean
  // KL(base || this) over the scored tokens' next-token distributions, and how often both put
  // the same token first.
  bool has_base = false;
  double base_ppl = 0;
  double kl_mean = 0;
  double kl_stderr = 0;  // standard error of kl_mean over the scored tokens
  // Standard error of the change in perplexity, in percent: from the per-token differences of
  // the two runs' log-probabilities (paired, so what both runs share cancels).
  double delta_ppl_stderr_pct = 0;
  double top1_agree_pct = 0;
  // With token eviction: the mean share of a scored token's context still in the cache.
  bool has_eviction = false;
  double kv_kept_pct = 100;
  int64_t evicted_tokens = 0;
};

struct PerplexityOptions {
  int32_t n_ctx = 512;
  int32_t bos_id = -1;  // replaces each chunk's first token when >= 0
  // The cache being measured: its types and calibration (kv.n_ctx and kv.block_size are
  // ignored: the cache holds one chunk of n_ctx, and a constant key offset averages over it).
  KvFormatOptions kv;
  bool kl_base = false;  // also run a cache of base_types and compare against it
  KvTypes base_types;    // f32/f32 unless told; a quantized base is refused
  // Token eviction (budget set): each chunk's first half is prefilled, evicted as the end of a
  // prefill is, and the scored half decoded token by token, evicting as generation would.
  EvictionConfig eviction;
  const Tokenizer* tokenizer = nullptr;  // for calibrations (the tri policy's); null: fixed ids
};

// The scores of one run's tokens, and (given) a base run's side by side: what ComputePerplexity
// and the KV codec bench (codec_bench.h) report.
class PerplexityTally {
 public:
  // One scored token: this run's logits row, the base run's (or null), the token that came.
  void Add(const float* row, const float* base_row, int32_t n_vocab, int32_t target);
  int64_t n_scored() const { return n_; }
  double running_ppl() const;
  // ppl, nll, nll_stddev, n_scored; and the base fields when rows of a base were added.
  void Finish(PerplexityResult* r) const;

 private:
  int64_t n_ = 0, agree_ = 0;
  bool has_base_ = false;
  double nll_ = 0, nll2_ = 0, base_nll_ = 0, kl_ = 0, kl2_ = 0, diff2_ = 0;
  std::vector<double> lp_, base_lp_;
};

// on_chunk(i, running_ppl) is called after each chunk (progress reporting).
Expected<PerplexityResult> ComputePerplexity(
    const Model& model, const std::vector<int32_t>& tokens, const PerplexityOptions& options,
    ThreadPool& pool, const std::function<void(int32_t, double)>& on_chunk = nullptr);

}  // namespace kvs
