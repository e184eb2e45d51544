#include "engine/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "engine/engine_builder.h"
#include "engine/evicting_chunk_runner.h"
#include "engine/sampler.h"
#include "engine/single_sequence.h"

namespace kvs {

namespace {

// log-softmax of a logit row, in double.
void LogSoftmax(const float* row, int32_t n, std::vector<double>* out) {
  out->resize(n);
  float max = row[0];
  for (int32_t v = 1; v < n; ++v) max = std::max(max, row[v]);
  double sum = 0;
  for (int32_t v = 0; v < n; ++v) sum += std::exp(static_cast<double>(row[v]) - max);
  const double log_sum = std::log(sum) + max;
  for (int32_t v = 0; v < n; ++v) (*out)[v] = row[v] - log_sum;
}

}  // namespace

void PerplexityTally::Add(const float* row, const float* base_row, int32_t n_vocab,
                          int32_t target) {
  LogSoftmax(row, n_vocab, &lp_);
  ++n_;
  nll_ -= lp_[target];
  nll2_ += lp_[target] * lp_[target];
  if (base_row == nullptr) return;
  has_base_ = true;
  LogSoftmax(base_row, n_vocab, &base_lp_);
  base_nll_ -= base_lp_[target];
  double kl_token = 0;
  for (int32_t v = 0; v < n_vocab; ++v) kl_token += std::exp(base_lp_[v]) * (base_lp_[v] - lp_[v]);
  kl_token = std::max(0.0, kl_token);
  kl_ += kl_token;
  kl2_ += kl_token * kl_token;
  const double diff = base_lp_[target] - lp_[target];  // this run's nll minus the base's
  diff2_ += diff * diff;
  agree_ += ArgMax(row, n_vocab) == ArgMax(base_row, n_vocab);
}

double PerplexityTally::running_ppl() const {
  return n_ > 0 ? std::exp(nll_ / n_) : 0.0;
}

void PerplexityTally::Finish(PerplexityResult* r) const {
  r->n_scored = n_;
  if (n_ == 0) return;
  r->nll = nll_ / n_;
  const auto stderr_of = [&](double mean, double sum_sq) {
    const double v = sum_sq / n_ - mean * mean;
    return (v > 0 && n_ > 1) ? std::sqrt(v / (n_ - 1)) : 0.0;
  };
  r->nll_stddev = stderr_of(r->nll, nll2_);
  r->ppl = std::exp(r->nll);
  if (!has_base_) return;
  r->has_base = true;
  r->base_ppl = std::exp(base_nll_ / n_);
  r->kl_mean = kl_ / n_;
  r->kl_stderr = stderr_of(r->kl_mean, kl2_);
  const double mean_diff = r->nll - base_nll_ / n_;
  r->delta_ppl_stderr_pct = 100.0 * std::exp(mean_diff) * stderr_of(mean_diff, diff2_);
  r->top1_agree_pct = 100.0 * agree_ / n_;
}

Expected<PerplexityResult> ComputePerplexity(const Model& model, const std::vector<int32_t>& tokens,
                                             const PerplexityOptions& options, ThreadPool& pool,
                                             const std::function<void(int32_t, double)>& on_chunk) {
  const int32_t n_vocab = model.config().n_vocab;
  const int32_t n_ctx = options.n_ctx;
  if (n_ctx < 4)
    return Status::Error(StrFormat("context %d is too small for perplexity (need >= 4)", n_ctx));
  // One chunk at least (the CLI asks two of the whole text, before --chunks cuts it).
  if (static_cast<int64_t>(tokens.size()) < static_cast<int64_t>(n_ctx)) {
    return Status::Error(
        StrFormat("the text has %zu tokens; perplexity with a context of %d needs at least %d",
                  tokens.size(), n_ctx, n_ctx));
  }
  const KvGeometry geometry = ModelKvGeometry(model.config(), kKvBlockTokens, options.kv.types);
  KVS_RETURN_IF_ERROR(geometry.Validate());
  if (options.kl_base &&
      (KvTypeIsQuantized(options.base_types.k) || KvTypeIsQuantized(options.base_types.v))) {
    return Status::Error(StrFormat("the KL base cache must be f32, f16 or bf16, not %s/%s",
                                   std::string(KvTypeName(options.base_types.k)).c_str(),
                                   std::string(KvTypeName(options.base_types.v)).c_str()));
  }
  auto t0 = std::chrono::steady_clock::now();
  PerplexityResult r;
  r.n_tokens = static_cast<int64_t>(tokens.size());
  r.n_chunks = static_cast<int32_t>(tokens.size() / n_ctx);
  r.has_base = options.kl_base;
  const int32_t first = n_ctx / 2;
  const int32_t n_scored_per_chunk = n_ctx - 1 - first;

  KvFormatOptions kv = options.kv;
  kv.block_size = kKvBlockTokens;
  auto measured = EngineBuilder(model, nullptr, pool, kv).Single(n_ctx);
  if (!measured.ok()) return measured.status();
  SingleSequence& seq = **measured;
  std::unique_ptr<SingleSequence> base;
  if (options.kl_base) {
    auto made =
        EngineBuilder(model, nullptr, pool, KvFormatWithTypes(options.base_types)).Single(n_ctx);
    if (!made.ok()) return made.status();
    base = std::move(*made);
  }
  std::unique_ptr<EvictingChunkRunner> evicting;
  if (options.eviction.budget.active()) {
    auto made = EvictingChunkRunner::Make(model, pool, options, n_ctx);
    if (!made.ok()) return made.status();
    evicting = std::move(*made);
  }
  const size_t logit_floats = static_cast<size_t>(n_ctx - first) * n_vocab;
  std::vector<float> logits(logit_floats), base_logits(options.kl_base ? logit_floats : 0);
  std::vector<int32_t> chunk(n_ctx);
  PerplexityTally tally;
  for (int32_t i = 0; i < r.n_chunks; ++i) {
    std::copy(tokens.begin() + static_cast<size_t>(i) * n_ctx,
              tokens.begin() + static_cast<size_t>(i + 1) * n_ctx, chunk.begin());
    if (options.bos_id >= 0) chunk[0] = options.bos_id;
    // Logits for positions first..n_ctx-1; the last one predicts past the chunk and is unused.
    if (evicting) {
      KVS_RETURN_IF_ERROR(evicting->Run(chunk, first, logits.data()));
    } else {
      KVS_RETURN_IF_ERROR(seq.Run(chunk.data(), n_ctx, 0, n_ctx - first, logits.data()));
    }
    if (base) {
      KVS_RETURN_IF_ERROR(base->Run(chunk.data(), n_ctx, 0, n_ctx - first, base_logits.data()));
    }
    for (int32_t j = 0; j < n_scored_per_chunk; ++j) {
      const size_t at = static_cast<size_t>(j) * n_vocab;
      tally.Add(logits.data() + at, base ? base_logits.data() + at : nullptr, n_vocab,
                chunk[first + j + 1]);
    }
    if (on_chunk) on_chunk(i, tally.running_ppl());
  }
  tally.Finish(&r);
  if (evicting) {
    r.has_eviction = true;
    r.kv_kept_pct = evicting->kept_pct();
    r.evicted_tokens = evicting->evicted_tokens();
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace kvs
