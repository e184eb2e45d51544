#include "kernels/key_whitening.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "kernels/kv_quant.h"

namespace kvs {
namespace {

// Eigen-decomposition of a symmetric n x n matrix a (destroyed) by cyclic Jacobi rotations:
// a = V diag(eig) V^T, V's columns the eigenvectors. n <= 16: a few sweeps converge to double
// precision.
void SymmetricEigen(double* a, int32_t n, double* eig, double* v) {
  for (int32_t i = 0; i < n; ++i) {
    for (int32_t j = 0; j < n; ++j) v[i * n + j] = i == j ? 1.0 : 0.0;
  }
  for (int sweep = 0; sweep < 64; ++sweep) {
    double off = 0.0, diag = 0.0;
    for (int32_t i = 0; i < n; ++i) {
      diag += a[i * n + i] * a[i * n + i];
      for (int32_t j = i + 1; j < n; ++j) off += a[i * n + j] * a[i * n + j];
    }
    if (off <= 1e-30 * diag || off == 0.0) break;
    for (int32_t p = 0; p < n; ++p) {
      for (int32_t q = p + 1; q < n; ++q) {
        const double apq = a[p * n + q];
        if (apq == 0.0) continue;
        const double theta = (a[q * n + q] - a[p * n + p]) / (2.0 * apq);
        const double t =
            (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1.0));
        const double c = 1.0 / std::sqrt(t * t + 1.0), s = t * c;
        for (int32_t k = 0; k < n; ++k) {  // columns p, q
          const double akp = a[k * n + p], akq = a[k * n + q];
          a[k * n + p] = c * akp - s * akq;
          a[k * n + q] = s * akp + c * akq;
        }
        for (int32_t k = 0; k < n; ++k) {  // rows p, q
          const double apk = a[p * n + k], aqk = a[q * n + k];
          a[p * n + k] = c * apk - s * aqk;
          a[q * n + k] = s * apk + c * aqk;
        }
        for (int32_t k = 0; k < n; ++k) {
          const double vkp = v[k * n + p], vkq = v[k * n + q];
          v[k * n + p] = c * vkp - s * vkq;
          v[k * n + q] = s * vkp + c * vkq;
        }
      }
    }
  }
  for (int32_t i = 0; i < n; ++i) eig[i] = a[i * n + i];
}

}  // namespace

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
