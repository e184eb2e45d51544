#include "engine/calibration_prefill.h"

#include <algorithm>

#include "engine/kv_format_factory.h"
#include "model/forward.h"

namespace kvs {

Expected<std::shared_ptr<const CalibrationPrefill>> CalibrationPrefill::Run(
    const Model& model, ThreadPool& pool, std::span<const int32_t> tokens, bool with_queries) {
  const ModelConfig& c = model.config();
  if (tokens.empty()) return Status::Error("calibration: no calibration tokens");
  for (int32_t t : tokens) {
    if (t < 0 || t >= c.n_vocab) {
      return Status::Error(StrFormat("calibration token %d is outside the vocabulary", t));
    }
  }
  std::shared_ptr<CalibrationPrefill> run(new CalibrationPrefill());
  run->tokens_.assign(tokens.begin(), tokens.end());
  const int32_t n = run->n_tokens();
  const int32_t n_blocks = (n + kKvBlockTokens - 1) / kKvBlockTokens;
  run->storage_ =
      std::make_unique<KvStorage>(PlainKvFormat(ModelKvGeometry(c, kKvBlockTokens)), n_blocks + 1);
  run->blocks_.resize(n_blocks);
  for (int32_t b = 0; b < n_blocks; ++b) run->blocks_[b] = b + 1;
  RaggedBatch batch;
  batch.AddSequence(run->tokens_.data(), n, 0, run->blocks_, 0);
  ForwardPass forward(model, pool);
  if (with_queries) {
    run->query_layer_floats_ = static_cast<size_t>(n) * c.n_head * c.head_dim_k;
    run->queries_.resize(run->query_layer_floats_ * c.n_layer);
    forward.set_query_tap([&](int32_t layer, const RaggedBatch&, const float* q) {
      std::copy_n(q, run->query_layer_floats_,
                  run->queries_.data() + static_cast<size_t>(layer) * run->query_layer_floats_);
    });
  }
  const Status st = forward.Run(batch, run->storage_->layers(), nullptr);
  if (!st.ok()) return Status::Error("calibration prefill: " + st.message());
  return std::shared_ptr<const CalibrationPrefill>(std::move(run));
}

Expected<std::shared_ptr<const CalibrationPrefill>> CalibrationRuns::Get(
    std::span<const int32_t> tokens, bool with_queries) {
  if (last_ != nullptr && std::ranges::equal(last_->tokens(), tokens) &&
      (!with_queries || last_->has_queries())) {
    return last_;
  }
  const bool share = std::ssize(tokens) <= share_up_to_;
  auto run = CalibrationPrefill::Run(model_, pool_, tokens, with_queries || share);
  if (!run.ok()) return run.status();
  ++num_runs_;
  last_ = share ? *run : nullptr;
  return *run;
}

}  // namespace kvs
