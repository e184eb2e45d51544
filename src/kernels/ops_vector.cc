// SwiGlu, GeGluTanh and DotF32 for one instruction-set level (compiled once per level).
#include "kernels/ops_vector.h"

#include <cmath>
#include <cstdint>

#include "kernels/isa_begin.h"
#include "kernels/simd.h"

namespace kvs::ops_internal::KVS_ISA {

namespace {

// out = g * sigmoid(t) * up over one vector, with e = exp(-|t|) <= 1 so nothing overflows:
// sigmoid(t) = 1 / (1 + e) for t >= 0 and e / (1 + e) for t < 0.
#if defined(KVS_ISA_AVX512)
inline __m512 GatedSigmoid(__m512 g, __m512 t, __m512 up) {
  const __m512 one = _mm512_set1_ps(1.f);
  const __m512 e = simd::ExpNonPositive(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_abs_ps(t)));
  const __mmask16 negative = _mm512_cmp_ps_mask(t, _mm512_setzero_ps(), _CMP_LT_OQ);
  const __m512 num = _mm512_mask_blend_ps(negative, one, e);
  const __m512 sig = _mm512_div_ps(num, _mm512_add_ps(one, e));
  return _mm512_mul_ps(_mm512_mul_ps(g, sig), up);
}
#elif defined(KVS_ISA_AVX2)
inline __m256 GatedSigmoid(__m256 g, __m256 t, __m256 up) {
  const __m256 one = _mm256_set1_ps(1.f);
  const __m256 e = simd::ExpNonPositive8(_mm256_or_ps(t, _mm256_set1_ps(-0.0f)));  // exp(-|t|)
  const __m256 negative = _mm256_cmp_ps(t, _mm256_setzero_ps(), _CMP_LT_OQ);
  const __m256 num = _mm256_blendv_ps(one, e, negative);
  const __m256 sig = _mm256_div_ps(num, _mm256_add_ps(one, e));
  return _mm256_mul_ps(_mm256_mul_ps(g, sig), up);
}
#endif

}  // namespace

void SwiGlu(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  // silu(g) = g * sigmoid(g)
#if defined(KVS_ISA_AVX512)
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    _mm512_storeu_ps(out + i, GatedSigmoid(g, g, _mm512_loadu_ps(up + i)));
  }
#elif defined(KVS_ISA_AVX2)
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    _mm256_storeu_ps(out + i, GatedSigmoid(g, g, _mm256_loadu_ps(up + i)));
  }
#endif
  for (; i < n; ++i) {
    float g = gate[i];
    out[i] = g / (1.f + std::exp(-g)) * up[i];
  }
}

void GeGluTanh(const float* gate, const float* up, float* out, int64_t n) {
  // gelu_tanh(g) = g / 2 * (1 + tanh(z)) = g * sigmoid(2z), z = sqrt(2/pi) * (g + 0.044715 g^3):
  // the sigmoid form of SwiGlu with t = g * (c1 + c3 g^2).
  constexpr float kC1 = 1.5957691216057308f;  // 2 sqrt(2/pi)
  constexpr float kC3 = 1.5957691216057308f * 0.044715f;
  int64_t i = 0;
#if defined(KVS_ISA_AVX512)
  const __m512 c1 = _mm512_set1_ps(kC1), c3 = _mm512_set1_ps(kC3);
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 t = _mm512_mul_ps(g, _mm512_fmadd_ps(_mm512_mul_ps(g, g), c3, c1));
    _mm512_storeu_ps(out + i, GatedSigmoid(g, t, _mm512_loadu_ps(up + i)));
  }
#elif defined(KVS_ISA_AVX2)
  const __m256 c1 = _mm256_set1_ps(kC1), c3 = _mm256_set1_ps(kC3);
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 t = _mm256_mul_ps(g, _mm256_fmadd_ps(_mm256_mul_ps(g, g), c3, c1));
    _mm256_storeu_ps(out + i, GatedSigmoid(g, t, _mm256_loadu_ps(up + i)));
  }
#endif
  for (; i < n; ++i) {
    const float g = gate[i];
    const float t = g * (kC1 + kC3 * g * g);
    out[i] = g / (1.f + std::exp(-t)) * up[i];
  }
}

// The compiler may not reorder a float reduction on its own, so the vector form is explicit.
float DotF32(const float* a, const float* b, int64_t n) {
#if defined(KVS_ISA_AVX512)
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
#elif defined(KVS_ISA_AVX2)
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), acc3);
  }
  for (; i + 8 <= n; i += 8) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  }
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * b[i];
  return simd::ReduceAdd8(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3))) +
         tail;
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

}  // namespace kvs::ops_internal::KVS_ISA

#include "kernels/isa_end.h"
