// Small SIMD helpers shared by the kernels of one level. Included only after kernels/isa_begin.h
// (which brings the intrinsics): the helpers live in the level's own inline namespace, so the
// levels' copies stay apart.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(KVS_ISA_AVX512)
namespace kvs::simd {
inline namespace KVS_ISA {

// exp(x) for x <= 0 (attention scores minus their max, -|x| for a sigmoid), relative error about
// 1e-7: x = n ln2 + r with |r| <= ln2 / 2, a degree-7 Taylor polynomial for exp(r), and 2^n applied
// by scalef.
inline __m512 ExpNonPositive(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.0f / 5040);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// Four int8 activations broadcast to every 32-bit lane: the signed operand of a dpbusd whose
// unsigned operand holds four codes of each of 16 weight rows.
inline __m512i Broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// 16 f16 values (one per interleaved row) widened to f32.
inline __m512 Halves16(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

}  // namespace KVS_ISA
}  // namespace kvs::simd
#endif

#if defined(KVS_ISA_AVX2) && !defined(KVS_ISA_AVX512)
namespace kvs::simd {
inline namespace KVS_ISA {

// exp(x) for x <= 0, 8 lanes: the same reduction and polynomial as the AVX-512 form, with 2^n
// built in the exponent bits (x >= -87 keeps n >= -126, a normal float).
inline __m256 ExpNonPositive8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.0f / 5040);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i e =
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

inline float ReduceAdd8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Largest of the eight lanes (no NaN among them: the callers' maxima skip NaNs).
inline float ReduceMax8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// 32 int32 values (q[0] first, each within [-128, 127]) as 32 int8 in order: the packs interleave
// the 128-bit lanes, the permute puts them back.
inline __m256i PackInt32ToInt8(const __m256i (&q)[4]) {
  return _mm256_permutevar8x32_epi32(
      _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3])),
      _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

// Sum of the eight int32 lanes.
inline int32_t ReduceAddEpi32x8(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// Pins v to a register at this point of the program. GCC otherwise computes every product of
// an unrolled sum `s = s + maddubs(...)` first and adds them up at the end, keeping all of them
// live: a Q4_0 tile of 4 tokens spilled 78 ymm registers that way.
template <class V>
inline void KeepInRegister(V& v) {
  asm("" : "+x"(v));
}

// Four int8 activations broadcast to every 32-bit lane.
inline __m256i Broadcast4x8(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// u8 x s8 products summed four to a 32-bit lane (what AVX-512 VNNI's dpbusd adds), for
// unsigned codes small enough that a pair of products fits int16 (codes <= 128 against any
// s8 activation): Q4_0 / Q4_K / Q6_K codes.
inline __m256i DotU8S8(__m256i codes, __m256i acts) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(codes, acts), _mm256_set1_epi16(1));
}

}  // namespace KVS_ISA
}  // namespace kvs::simd
#endif
