#include "engine/query_centres.h"

#include "engine/kv_format_factory.h"
#include "kernels/ops.h"
#include "kv/kv_format.h"
#include "model/forward.h"

namespace kvs {

Expected<std::shared_ptr<const TriCalibration>> MeasureTriCalibration(
    const Model& model, ThreadPool& pool, const std::vector<int32_t>& tokens) {
  if (tokens.empty()) return Status::Error("tri calibration: no calibration tokens");
  auto run = CalibrationPrefill::Run(model, pool, tokens, /*with_queries=*/true);
  if (!run.ok()) return Status::Error("tri calibration run: " + run.error());
  return MeasureTriCalibration(model, **run);
}

Expected<std::shared_ptr<const TriCalibration>> MeasureTriCalibration(
    const Model& model, const CalibrationPrefill& run) {
  const ModelConfig& c = model.config();
  const int32_t n_tokens = run.n_tokens();
  if (n_tokens < 1 || !run.has_queries()) {
    return Status::Error("tri calibration: needs a prefill with its queries");
  }
  if (c.uniform_rope() == nullptr) {
    return Status::Error(
        "the tri eviction policy needs one RoPE for every layer; this model's "
        "layers differ");
  }
  const RopeParams rope = model.Rope(0);
  auto cal = std::make_shared<TriCalibration>();
  cal->n_layer = c.n_layer;
  cal->n_head = c.n_head;
  cal->n_head_kv = c.n_head_kv;
  cal->head_dim = c.head_dim_k;
  cal->n_rot = rope.n_rot;
  cal->rope_neox = rope.neox;
  // From RopeAngles' own formula, not atan2 of its cos/sin at position 1: that folds angles
  // above π (freq_scale * freq > π happens with rope_freqs factors below 1) into (−π, π].
  cal->theta.resize(rope.n_rot / 2);
  for (int32_t i = 0; i < rope.n_rot / 2; ++i) {
    cal->theta[i] = static_cast<float>(rope.freq_scale * RopeFrequency(i, rope));
  }

  // Each query turned back by its token's position: the inverse of the forward pass's ApplyRope
  // with the same float cos/sin, so what is undone is exactly what was done.
  const int32_t hd = c.head_dim_k, n_rot = rope.n_rot;
  const size_t q_row = static_cast<size_t>(c.n_head) * hd;
  std::vector<double> sum(static_cast<size_t>(c.n_layer) * q_row, 0.0);  // [layer][head][dim]
  std::vector<float> cos_sin(n_rot), q(hd);                              // [n_rot], [head_dim]
  for (int32_t layer = 0; layer < c.n_layer; ++layer) {
    const float* queries = run.queries(layer);
    for (int32_t i = 0; i < n_tokens; ++i) {
      RopeAngles(i, rope, cos_sin.data());  // the prefill's token i sits at position i
      for (int32_t j = n_rot / 2; j < n_rot; ++j) cos_sin[j] = -cos_sin[j];  // rotate by -p
      for (int32_t h = 0; h < c.n_head; ++h) {
        const float* qh = queries + i * q_row + static_cast<size_t>(h) * hd;
        q.assign(qh, qh + hd);
        ApplyRope(q.data(), cos_sin.data(), n_rot, rope.neox);
        double* s = sum.data() + static_cast<size_t>(layer) * q_row + static_cast<size_t>(h) * hd;
        for (int32_t e = 0; e < hd; ++e) s[e] += q[e];
      }
    }
  }

  cal->query_mean.resize(sum.size());
  for (size_t e = 0; e < sum.size(); ++e)
    cal->query_mean[e] = static_cast<float>(sum[e] / n_tokens);
  KVS_RETURN_IF_ERROR(cal->Validate());
  return std::shared_ptr<const TriCalibration>(std::move(cal));
}

}  // namespace kvs
