#include "kv/eviction_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "kv/tri_policy.h"

namespace kvs {

Status StreamingPolicy::Score(const EvictionInput& input, std::span<float> scores) const {
  if (static_cast<int32_t>(scores.size()) != input.n_slots ||
      static_cast<int32_t>(input.positions.size()) != input.n_slots) {
    return Status::Error("streaming: scores and positions must cover every slot");
  }
  for (int32_t i = 0; i < input.n_slots; ++i) scores[i] = static_cast<float>(input.positions[i]);
  return Status::Ok();
}

Status KeyDiffPolicy::Score(const EvictionInput& input, std::span<float> scores) const {
  const int64_t per_slot = int64_t{input.n_head_kv} * input.head_dim;
  if (static_cast<int32_t>(scores.size()) != input.n_slots || input.n_head_kv <= 0 ||
      input.head_dim <= 0 || static_cast<int64_t>(input.keys.size()) != per_slot * input.n_slots) {
    return Status::Error("keydiff: needs every slot's keys ([slots][heads][head_dim])");
  }
  std::fill(scores.begin(), scores.end(), 0.0f);
  std::vector<double> mean(input.head_dim);
  // A slot with a non-finite key (in any head) scores NaN, which SelectKept ranks last; it is
  // left out of the mean so that one broken key does not turn every slot's score into NaN.
  std::vector<char> broken(input.n_slots, 0);
  for (int32_t i = 0; i < input.n_slots; ++i) {
    const float* k = input.keys.data() + i * per_slot;
    for (int64_t e = 0; e < per_slot && !broken[i]; ++e) broken[i] = !std::isfinite(k[e]);
  }
  for (int32_t h = 0; h < input.n_head_kv; ++h) {
    std::fill(mean.begin(), mean.end(), 0.0);
    for (int32_t i = 0; i < input.n_slots; ++i) {
      if (broken[i]) continue;
      const float* k = input.keys.data() + i * per_slot + int64_t{h} * input.head_dim;
      for (int32_t d = 0; d < input.head_dim; ++d) mean[d] += k[d];
    }
    double mean_norm = 0.0;
    for (double m : mean) mean_norm += m * m;
    mean_norm = std::sqrt(mean_norm);
    for (int32_t i = 0; i < input.n_slots; ++i) {
      if (broken[i]) {
        scores[i] = std::numeric_limits<float>::quiet_NaN();
        continue;
      }
      const float* k = input.keys.data() + i * per_slot + int64_t{h} * input.head_dim;
      double dot = 0.0, norm = 0.0;
      for (int32_t d = 0; d < input.head_dim; ++d) {
        dot += k[d] * mean[d];
        norm += static_cast<double>(k[d]) * k[d];
      }
      const double denom = std::sqrt(norm) * mean_norm;
      const double cosine = denom > 0.0 ? dot / denom : 0.0;
      scores[i] += static_cast<float>((1.0 - cosine) / input.n_head_kv);
    }
  }
  return Status::Ok();
}

namespace {

Status CheckMass(const EvictionInput& input, std::span<float> scores, const char* policy) {
  if (static_cast<int32_t>(scores.size()) != input.n_slots ||
      static_cast<int32_t>(input.attention_mass.size()) != input.n_slots) {
    return Status::Error(StrFormat("%s: needs the attention every slot received", policy));
  }
  return Status::Ok();
}

}  // namespace

Status H2oPolicy::Score(const EvictionInput& input, std::span<float> scores) const {
  KVS_RETURN_IF_ERROR(CheckMass(input, scores, "h2o"));
  std::copy(input.attention_mass.begin(), input.attention_mass.end(), scores.begin());
  return Status::Ok();
}

Status SnapKvPolicy::Score(const EvictionInput& input, std::span<float> scores) const {
  KVS_RETURN_IF_ERROR(CheckMass(input, scores, "snapkv"));
  const int32_t n = input.n_slots, half = kPool / 2;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t lo = std::max(0, i - half), hi = std::min(n - 1, i + half);
    double sum = 0.0;
    for (int32_t j = lo; j <= hi; ++j) sum += input.attention_mass[j];
    scores[i] = static_cast<float>(sum / (hi - lo + 1));
  }
  return Status::Ok();
}

Expected<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(
    std::string_view name, std::shared_ptr<const TriCalibration> tri) {
  if (name == "streaming") return std::unique_ptr<EvictionPolicy>(new StreamingPolicy());
  if (name == "keydiff") return std::unique_ptr<EvictionPolicy>(new KeyDiffPolicy());
  if (name == "h2o") return std::unique_ptr<EvictionPolicy>(new H2oPolicy());
  if (name == "snapkv") return std::unique_ptr<EvictionPolicy>(new SnapKvPolicy());
  if (name == "tri") {
    if (tri == nullptr) {
      return Status::Error(
          "--evict-policy tri: the tri policy needs a calibration pass over the model (its "
          "mean queries before RoPE); the engine runs it at start-up");
    }
    KVS_RETURN_IF_ERROR(tri->Validate());
    return std::unique_ptr<EvictionPolicy>(new TriPolicy(std::move(tri)));
  }
  return Status::Error("--evict-policy '" + std::string(name) +
                       "': expected streaming (sinks + recent window), h2o (attention "
                       "received), snapkv (attention of the prompt's last tokens, pooled), "
                       "keydiff (keys least like the mean key) or tri (pre-RoPE key geometry "
                       "against calibrated query centres)");
}

Expected<std::vector<int32_t>> SelectKept(std::span<const float> scores, int32_t budget,
                                          const EvictionGuard& guard, int32_t frozen) {
  const int32_t n = static_cast<int32_t>(scores.size());
  if (guard.sink < 0 || guard.window < 0 || frozen < 0) {
    return Status::Error("eviction: sink, window and frozen slots must be >= 0");
  }
  if (budget < int64_t{guard.sink} + guard.window) {
    return Status::Error(
        StrFormat("--kv-budget %d: must be at least --kv-sink + --kv-window (%d + %d)", budget,
                  guard.sink, guard.window));
  }
  std::vector<int32_t> kept;
  if (budget >= n) {
    kept.resize(n);
    std::iota(kept.begin(), kept.end(), 0);
    return kept;
  }
  if (frozen > budget) {
    return Status::Error(StrFormat(
        "eviction: %d shared slots cannot be evicted, more than the budget of %d", frozen, budget));
  }
  std::vector<char> keep(n, 0);
  int32_t n_kept = 0;
  auto mark = [&](int32_t i) {
    if (!keep[i]) keep[i] = 1, ++n_kept;
  };
  for (int32_t i = 0; i < std::min(n, frozen); ++i) mark(i);
  for (int32_t i = 0; i < std::min(n, guard.sink); ++i) mark(i);
  for (int32_t i = std::max(0, n - guard.window); i < n; ++i) mark(i);
  // Frozen slots and the window may overlap the budget together though neither does alone.
  if (n_kept > budget) {
    return Status::Error(StrFormat(
        "eviction: %d shared slots, the sinks and the last %d slots make %d slots that cannot be "
        "evicted, more than the budget of %d",
        frozen, guard.window, n_kept, budget));
  }
  std::vector<int32_t> rest;
  for (int32_t i = 0; i < n; ++i) {
    if (!keep[i]) rest.push_back(i);
  }
  // Best score first; among equals the later slot (the more recent token). A NaN score (a
  // policy fed a broken key) ranks last rather than breaking the sort's ordering.
  auto score = [&](int32_t i) {
    return std::isnan(scores[i]) ? -std::numeric_limits<float>::infinity() : scores[i];
  };
  std::sort(rest.begin(), rest.end(), [&](int32_t a, int32_t b) {
    return score(a) != score(b) ? score(a) > score(b) : a > b;
  });
  for (int32_t i : rest) {
    if (n_kept >= budget) break;
    mark(i);
  }
  for (int32_t i = 0; i < n; ++i) {
    if (keep[i]) kept.push_back(i);
  }
  return kept;
}

}  // namespace kvs
