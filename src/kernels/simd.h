// One place that pulls in the x86 intrinsics. GCC 12 reports its own AVX-512 intrinsics as
// (maybe) uninitialized (GCC bug 105593), so the include is wrapped to keep builds clean.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) || defined(__AVX2__)
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif
#endif

#if defined(__AVX512F__)
namespace kvs::simd {

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

}  // namespace kvs::simd
#endif
