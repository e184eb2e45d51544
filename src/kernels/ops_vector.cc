// SwiGlu and DotF32 for one instruction-set level (compiled once per level).
#include "kernels/ops_vector.h"

#include <cmath>
#include <cstdint>

#include "kernels/isa_begin.h"
#include "kernels/simd.h"

namespace kvs::ops_internal::KVS_ISA {

void SwiGlu(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
#if defined(KVS_ISA_AVX512)
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
#elif defined(KVS_ISA_AVX2)
  const __m256 one = _mm256_set1_ps(1.f);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = simd::ExpNonPositive8(_mm256_or_ps(g, sign));  // exp(-|g|)
    const __m256 negative = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ);
    const __m256 num = _mm256_blendv_ps(one, e, negative);
    const __m256 sig = _mm256_div_ps(num, _mm256_add_ps(one, e));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(g, sig), _mm256_loadu_ps(up + i)));
  }
#endif
  for (; i < n; ++i) {
    float g = gate[i];
    out[i] = g / (1.f + std::exp(-g)) * up[i];
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
