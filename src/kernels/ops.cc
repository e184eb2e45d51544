#include "kernels/ops.h"

#include <cmath>

#include "kernels/isa_dispatch.h"
#include "kernels/ops_vector.h"

namespace kvs {

void RmsNorm(const float* x, const float* weight, int64_t n, float eps, float* out) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  float scale = static_cast<float>(1.0 / std::sqrt(sum / n + eps));
  if (weight) {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * weight[i];
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale;
  }
}

double RopeFrequency(int32_t i, const RopeParams& p) {
  double freq = std::pow(static_cast<double>(p.freq_base), -2.0 * i / p.n_rot);
  if (p.freq_factors) freq /= p.freq_factors[i];
  return freq;
}

void RopeAngles(int32_t pos, const RopeParams& p, float* cos_sin) {
  const int32_t half = p.n_rot / 2;
  for (int32_t i = 0; i < half; ++i) {
    const double freq = RopeFrequency(i, p);
    double theta = static_cast<double>(pos) * p.freq_scale * freq;
    cos_sin[i] = static_cast<float>(std::cos(theta));
    cos_sin[half + i] = static_cast<float>(std::sin(theta));
  }
}

void ApplyRope(float* x, const float* cos_sin, int32_t n_rot, bool neox) {
  const int32_t half = n_rot / 2;
  for (int32_t i = 0; i < half; ++i) {
    float c = cos_sin[i], s = cos_sin[half + i];
    const RopePair pair = RopePairDims(i, n_rot, neox);
    float* a = &x[pair.a];
    float* b = &x[pair.b];
    float x0 = *a, x1 = *b;
    *a = x0 * c - x1 * s;
    *b = x0 * s + x1 * c;
  }
}

void Softmax(float* x, int64_t n) {
  float max = -INFINITY;
  for (int64_t i = 0; i < n; ++i) max = x[i] > max ? x[i] : max;
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

float DotF32Reference(const float* a, const float* b, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(a[i]) * b[i];
  return static_cast<float>(sum);
}

void SwiGlu(const float* gate, const float* up, float* out, int64_t n) {
  using namespace ops_internal;  // NOLINT: the levels' namespaces
  KVS_DISPATCH(SwiGlu(gate, up, out, n));
}

void GeGluTanh(const float* gate, const float* up, float* out, int64_t n) {
  using namespace ops_internal;  // NOLINT
  KVS_DISPATCH(GeGluTanh(gate, up, out, n));
}

float DotF32(const float* a, const float* b, int64_t n) {
  using namespace ops_internal;  // NOLINT
  KVS_DISPATCH(DotF32(a, b, n));
}

void Axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void AddInPlace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

}  // namespace kvs
