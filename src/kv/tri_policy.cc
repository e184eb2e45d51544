#include "kv/tri_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/ops.h"

namespace kvs {

Status TriCalibration::Validate() const {
  if (n_layer <= 0 || n_head <= 0 || n_head_kv <= 0 || head_dim <= 0 || n_head % n_head_kv != 0) {
    return Status::Error(StrFormat(
        "tri calibration: %d layers, %d query heads over %d KV heads of %d dims (need positive "
        "sizes and query heads a multiple of KV heads)",
        n_layer, n_head, n_head_kv, head_dim));
  }
  if (n_rot < 0 || n_rot % 2 != 0 || n_rot > head_dim) {
    return Status::Error(
        StrFormat("tri calibration: %d rotated dims (need an even number up to head_dim %d)", n_rot,
                  head_dim));
  }
  if (static_cast<int64_t>(theta.size()) != n_rot / 2) {
    return Status::Error(StrFormat("tri calibration: %zu RoPE angles for %d rotated pairs",
                                   theta.size(), n_rot / 2));
  }
  const int64_t n_mean = int64_t{n_layer} * n_head * head_dim;
  if (static_cast<int64_t>(query_mean.size()) != n_mean) {
    return Status::Error(
        StrFormat("tri calibration: %zu query-mean values, expected %lld ([layer][head][dim])",
                  query_mean.size(), static_cast<long long>(n_mean)));
  }
  auto finite = [](float v) { return std::isfinite(v); };
  if (!std::all_of(theta.begin(), theta.end(), finite) ||
      !std::all_of(query_mean.begin(), query_mean.end(), finite)) {
    return Status::Error("tri calibration: a RoPE angle or query mean is not finite");
  }
  return Status::Ok();
}

TriPolicy::TriPolicy(std::shared_ptr<const TriCalibration> calibration)
    : calibration_(std::move(calibration)),
      valid_(calibration_ != nullptr
                 ? calibration_->Validate()
                 : Status::Error("tri: no calibration (the engine measures it at start-up)")) {}

namespace {

Status CheckInput(const TriCalibration& cal, const EvictionInput& input,
                  std::span<const float> scores) {
  if (input.n_slots < 0 || static_cast<int32_t>(scores.size()) != input.n_slots ||
      static_cast<int32_t>(input.positions.size()) != input.n_slots) {
    return Status::Error("tri: scores and positions must cover every slot");
  }
  if (input.n_head_kv != cal.n_head_kv || input.head_dim != cal.head_dim) {
    return Status::Error(
        StrFormat("tri: keys of %d KV heads x %d dims, but the calibration is for %d x %d",
                  input.n_head_kv, input.head_dim, cal.n_head_kv, cal.head_dim));
  }
  const int64_t per_slot = int64_t{cal.n_head_kv} * cal.head_dim;
  if (static_cast<int64_t>(input.keys.size()) != per_slot * input.n_slots) {
    return Status::Error("tri: needs every slot's keys ([slots][heads][head_dim])");
  }
  if (input.layer < 0 || input.layer >= cal.n_layer) {
    return Status::Error(
        StrFormat("tri: layer %d outside the calibration's %d layers", input.layer, cal.n_layer));
  }
  for (int32_t p : input.positions) {
    if (p < 0 || p >= input.n_positions) {
      return Status::Error(StrFormat(
          "tri: a key at position %d, outside the sequence's %d positions", p, input.n_positions));
    }
  }
  return Status::Ok();
}

// The layer's query centres, scaled by 1/sqrt(head_dim) and turned to the averaged future
// position: [n_head][head_dim].
std::vector<double> TurnedQueryCentres(const TriCalibration& cal, const EvictionInput& input) {
  // The predicted logit of key k_post (written at p, after RoPE) for the query centre q̄ at t:
  // q̄ᵀ R((p − t)θ) k_pre = (R(tθ) q̄)ᵀ R(pθ) k_pre = (R(tθ) q̄)ᵀ k_post. So instead of turning
  // every key back by its position and forward by each offset t − p (the per-slot trig series),
  // turn the query centre to each future position t once; the key as stored already carries its
  // position. And the average over the offsets is linear, so it is one dot product with the
  // centre turned by the averaged cos/sin: per slot and query head, head_dim multiply-adds.
  const int32_t half = cal.n_rot / 2, hd = cal.head_dim;
  std::vector<double> cos_avg(half, 0.0), sin_avg(half, 0.0);  // [n_rot/2]
  const double n_off = static_cast<double>(TriPolicy::kFutureOffsets.size());
  for (int32_t d : TriPolicy::kFutureOffsets) {
    const double t = static_cast<double>(input.n_positions) + d;
    for (int32_t i = 0; i < half; ++i) {
      cos_avg[i] += std::cos(t * cal.theta[i]) / n_off;
      sin_avg[i] += std::sin(t * cal.theta[i]) / n_off;
    }
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> query(static_cast<size_t>(cal.n_head) * hd);  // [n_head][head_dim]
  for (int32_t h = 0; h < cal.n_head; ++h) {
    const float* qm =
        cal.query_mean.data() + (static_cast<size_t>(input.layer) * cal.n_head + h) * hd;
    double* q = query.data() + static_cast<size_t>(h) * hd;
    for (int32_t e = 0; e < hd; ++e) q[e] = qm[e] * scale;
    for (int32_t i = 0; i < half; ++i) {
      const RopePair pair = RopePairDims(i, cal.n_rot, cal.rope_neox);
      const double a = qm[pair.a] * scale, b = qm[pair.b] * scale;
      q[pair.a] = a * cos_avg[i] - b * sin_avg[i];
      q[pair.b] = a * sin_avg[i] + b * cos_avg[i];
    }
  }
  return query;
}

}  // namespace

Status TriPolicy::Score(const EvictionInput& input, std::span<float> scores) const {
  KVS_RETURN_IF_ERROR(valid_);
  const TriCalibration& cal = *calibration_;
  KVS_RETURN_IF_ERROR(CheckInput(cal, input, scores));

  const int32_t hd = cal.head_dim;
  const int64_t per_slot = int64_t{cal.n_head_kv} * hd;
  const std::vector<double> query = TurnedQueryCentres(cal, input);  // [n_head][head_dim]

  // A slot with a non-finite key (in any head) scores NaN, which SelectKept ranks last; it is
  // left out of the z-scores so that one broken key does not spoil every slot's score.
  std::vector<char> broken(input.n_slots, 0);
  for (int32_t s = 0; s < input.n_slots; ++s) {
    const float* k = input.keys.data() + s * per_slot;
    for (int64_t e = 0; e < per_slot && !broken[s]; ++e) broken[s] = !std::isfinite(k[e]);
  }
  std::fill(scores.begin(), scores.end(), 0.0f);
  const int32_t group = cal.n_head / cal.n_head_kv;
  std::vector<double> head_score(input.n_slots);  // [n_slots] one KV head's scores
  for (int32_t kv = 0; kv < cal.n_head_kv; ++kv) {
    double sum = 0.0;
    int32_t n_ok = 0;
    for (int32_t s = 0; s < input.n_slots; ++s) {
      if (broken[s]) continue;
      const float* k = input.keys.data() + s * per_slot + int64_t{kv} * hd;
      // Max over the group, not the mean: the heads sharing this KV head read the same kept set,
      // and a key that one of them will attend to is needed even if the others ignore it; a mean
      // would dilute a head-specific key below generic ones.
      double best = -std::numeric_limits<double>::infinity();
      for (int32_t g = 0; g < group; ++g) {
        const double* q = query.data() + static_cast<size_t>(kv * group + g) * hd;
        double dot = 0.0;
        for (int32_t e = 0; e < hd; ++e) dot += q[e] * k[e];
        best = std::max(best, dot);
      }
      head_score[s] = best;
      sum += best;
      ++n_ok;
    }
    if (n_ok == 0) continue;
    // z-scores over the slots, so that heads whose logits run on different scales count alike.
    // A head that scores every slot alike says nothing: it adds 0.
    const double mean = sum / n_ok;
    double var = 0.0;  // two passes: logits share a large common part that E[x²] − E[x]² loses
    for (int32_t s = 0; s < input.n_slots; ++s) {
      if (!broken[s]) var += (head_score[s] - mean) * (head_score[s] - mean) / n_ok;
    }
    const double sd = std::sqrt(var);
    if (!(sd > 1e-12 * std::max(1.0, std::abs(mean)))) continue;
    for (int32_t s = 0; s < input.n_slots; ++s) {
      if (!broken[s]) scores[s] += static_cast<float>((head_score[s] - mean) / sd / cal.n_head_kv);
    }
  }
  for (int32_t s = 0; s < input.n_slots; ++s) {
    if (broken[s]) scores[s] = std::numeric_limits<float>::quiet_NaN();
  }
  return Status::Ok();
}

}  // namespace kvs
