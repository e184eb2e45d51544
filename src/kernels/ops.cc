#include "kernels/ops.h"

#include <cmath>

#include "kernels/simd.h"

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

void SwiGlu(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  // silu(g) = g * sigmoid(g), with e = exp(-|g|) <= 1 so nothing overflows:
  // sigmoid(g) = 1 / (1 + e) for g >= 0 and e / (1 + e) for g < 0.
  const __m512 one = _mm512_set1_ps(1.f);
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 e = simd::ExpNonPositive(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(g)));
    const __mmask16 negative = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
    const __m512 num = _mm512_mask_blend_ps(negative, one, e);
    const __m512 sig = _mm512_div_ps(num, _mm512_add_ps(one, e));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_mul_ps(g, sig), _mm512_loadu_ps(up + i)));
  }
#endif
  for (; i < n; ++i) {
    float g = gate[i];
    out[i] = g / (1.f + std::exp(-g)) * up[i];
  }
}

float DotF32Reference(const float* a, const float* b, int64_t n) {
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(a[i]) * b[i];
  return static_cast<float>(sum);
}

// The compiler may not reorder a float reduction on its own, so the vector form is explicit.
float DotF32(const float* a, const float* b, int64_t n) {
#if defined(__AVX512F__)
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
  }
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? 0xffff : static_cast<__mmask16>((1u << (n - i)) - 1);
    acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
#else
  float sum[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int k = 0; k < 8; ++k) sum[k] += a[i + k] * b[i + k];
  }
  for (; i < n; ++i) sum[0] += a[i] * b[i];
  return ((sum[0] + sum[1]) + (sum[2] + sum[3])) + ((sum[4] + sum[5]) + (sum[6] + sum[7]));
#endif
}

void Axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void AddInPlace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

}  // namespace kvs
