#include "kernels/key_whitening.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "kernels/kv_quant.h"
#include "kernels/symmetric_eigen.h"

namespace kvs {

bool KvKeysWhitened(KvType t, int32_t head_dim) {
  return (t == KvType::kTurbo4 || t == KvType::kTurbo3) && head_dim <= kMaxWhitenedHeadDim;
}

KeyWhitening FitKeyWhitening(const float* keys, int32_t n_keys, size_t stride, int32_t n) {
  KVS_CHECK(n >= 1 && n <= kMaxWhitenedHeadDim && n_keys >= 1);
  constexpr int32_t kN = kMaxWhitenedHeadDim;
  double mean[kN] = {}, a[kN * kN] = {}, u[kN * kN], eig[kN];
  for (int32_t i = 0; i < n_keys; ++i) {
    for (int32_t d = 0; d < n; ++d) mean[d] += keys[i * stride + d] / double(n_keys);
  }
  for (int32_t i = 0; i < n_keys; ++i) {  // covariance, into a
    const float* k = keys + i * stride;
    for (int32_t r = 0; r < n; ++r) {
      for (int32_t c = 0; c < n; ++c) a[r * n + c] += (k[r] - mean[r]) * (k[c] - mean[c]) / n_keys;
    }
  }
  SymmetricEigen(a, n, eig, u);
  double mean_eig = 0.0;
  for (int32_t i = 0; i < n; ++i) mean_eig += std::max(eig[i], 0.0) / n;
  if (!(mean_eig > 0.0)) mean_eig = 1.0;  // no spread measured: plain scaling
  KeyWhitening w;
  for (int32_t i = 0; i < n; ++i) w.mean[i] = static_cast<float>(mean[i]);
  float inverse[kN * kN];  // U L^1/2, before the rotation is folded in
  for (int32_t i = 0; i < n; ++i) {
    const double lambda = std::max(eig[i], 0.0) + 0.01 * mean_eig;
    const double root = std::sqrt(lambda);
    for (int32_t d = 0; d < n; ++d) {
      w.to_coords[i * n + d] = static_cast<float>(u[d * n + i] / root);  // row i: u_i^T / sqrt
      inverse[d * n + i] = static_cast<float>(u[d * n + i] * root);
    }
  }
  // F = inverse R^T: row d of F is (R row d of inverse)^T.
  for (int32_t d = 0; d < n; ++d) {
    std::copy(inverse + d * n, inverse + (d + 1) * n, w.from_coords + d * n);
    RotateForward(w.from_coords + d * n, n);
  }
  return w;
}

void WhitenKey(const KeyWhitening& w, int32_t n, const float* key, float* y) {
  float centred[kMaxWhitenedHeadDim];
  for (int32_t d = 0; d < n; ++d) centred[d] = key[d] - w.mean[d];
  for (int32_t i = 0; i < n; ++i) {
    float s = 0.0f;
    for (int32_t d = 0; d < n; ++d) s += w.to_coords[i * n + d] * centred[d];
    y[i] = s;
  }
}

void UnwhitenKey(const KeyWhitening& w, int32_t n, const float* stored, float* key) {
  for (int32_t d = 0; d < n; ++d) {
    float s = w.mean[d];
    for (int32_t j = 0; j < n; ++j) s += w.from_coords[d * n + j] * stored[j];
    key[d] = s;
  }
}

}  // namespace kvs
