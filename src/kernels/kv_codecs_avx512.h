// AVX-512 readers of the KV head-block layouts (kv_types.h), for the attention kernel. A codec
// widens 16 stored codes to floats:
//   Keys(row)                   one key dim's 16 positions (row = that dim's data)
//   Values(row, c0, lanes)      dims c0.. of one value row, `lanes` of them (the rest zero)
// The group scale is not applied here; kScaleMul is a constant the scale needs on top (fp8
// widens through f16 with its exponent shifted by 8).
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/kv_quant.h"
#include "kernels/simd.h"

namespace kvs::kv_simd {
inline namespace KVS_ISA {

inline __mmask16 FirstLanes(int32_t n) {
  return n >= 16  ? static_cast<__mmask16>(0xffff)
         : n <= 0 ? static_cast<__mmask16>(0)
                  : static_cast<__mmask16>((1u << n) - 1);
}

struct F32Codec {
  static constexpr int kBits = 32;
  static constexpr float kScaleMul = 1.0f;
  __m512 Keys(const uint8_t* row) const { return _mm512_loadu_ps(row); }
  __m512 Values(const uint8_t* row, int32_t c0, int32_t lanes) const {
    return _mm512_maskz_loadu_ps(FirstLanes(lanes), row + 4 * c0);
  }
};

struct F16Codec {
  static constexpr int kBits = 16;
  static constexpr float kScaleMul = 1.0f;
  __m512 Keys(const uint8_t* row) const {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row)));
  }
  __m512 Values(const uint8_t* row, int32_t c0, int32_t lanes) const {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(FirstLanes(lanes), row + 2 * c0));
  }
};

struct BF16Codec {
  static constexpr int kBits = 16;
  static constexpr float kScaleMul = 1.0f;
  static __m512 Widen(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  __m512 Keys(const uint8_t* row) const {
    return Widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row)));
  }
  __m512 Values(const uint8_t* row, int32_t c0, int32_t lanes) const {
    return Widen(_mm256_maskz_loadu_epi16(FirstLanes(lanes), row + 2 * c0));
  }
};

struct Int8Codec {  // q8_0 and int8
  static constexpr int kBits = 8;
  static constexpr float kScaleMul = 1.0f;
  __m512 Keys(const uint8_t* row) const {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row))));
  }
  __m512 Values(const uint8_t* row, int32_t c0, int32_t lanes) const {
    return _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(FirstLanes(lanes), row + c0)));
  }
};

struct Fp8Codec {  // e4m3: sign and the 7 low bits moved into an f16, worth 2^-8 of the value
  static constexpr int kBits = 8;
  static constexpr float kScaleMul = 256.0f;
  static __m512 Widen(__m128i b) {
    const __m256i x = _mm256_cvtepu8_epi16(b);
    const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(x, _mm256_set1_epi16(0x80)), 8);
    const __m256i mag = _mm256_slli_epi16(_mm256_and_si256(x, _mm256_set1_epi16(0x7f)), 7);
    return _mm512_cvtph_ps(_mm256_or_si256(sign, mag));
  }
  __m512 Keys(const uint8_t* row) const {
    return Widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row)));
  }
  __m512 Values(const uint8_t* row, int32_t c0, int32_t lanes) const {
    return Widen(_mm_maskz_loadu_epi8(FirstLanes(lanes), row + c0));
  }
};

// 4-bit codes into a 16-entry codebook (q4_0's -8..7, turbo4's levels): one permute per 16.
struct Nibble4Codec {
  static constexpr int kBits = 4;
  static constexpr float kScaleMul = 1.0f;
  __m512 levels;
  explicit Nibble4Codec(KvType t) : levels(_mm512_loadu_ps(KvCodebook(t))) {}
  __m512 Widen(__m128i packed) const {
    const __m128i mask = _mm_set1_epi8(0x0f);
    const __m128i lo = _mm_and_si128(packed, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(packed, 4), mask);
    const __m512i idx = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));
    return _mm512_permutexvar_ps(idx, levels);
  }
  __m512 Keys(const uint8_t* row) const {
    return Widen(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row)));
  }
  __m512 Values(const uint8_t* row, int32_t c0, int32_t lanes) const {
    const __m128i packed = _mm_maskz_loadu_epi8(FirstLanes(lanes / 2), row + c0 / 2);
    return _mm512_maskz_mov_ps(FirstLanes(lanes), Widen(packed));
  }
};

// 3-bit codes in runs of 16 (8 at a row's end): a 2-bit plane, then a plane of high bits.
struct Bit3Codec {
  static constexpr int kBits = 3;
  static constexpr float kScaleMul = 1.0f;
  __m512 levels;
  __m512i shifts;
  explicit Bit3Codec(KvType t)
      : levels(_mm512_loadu_ps(KvCodebook(t))),
        shifts(_mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0)) {}
  __m512 Widen(uint32_t lo_plane, uint32_t hi_plane) const {
    __m512i idx = _mm512_and_si512(
        _mm512_srlv_epi32(_mm512_set1_epi32(static_cast<int32_t>(lo_plane)), shifts),
        _mm512_set1_epi32(3));
    idx = _mm512_mask_or_epi32(idx, static_cast<__mmask16>(hi_plane), idx, _mm512_set1_epi32(4));
    return _mm512_permutexvar_ps(idx, levels);
  }
  __m512 Keys(const uint8_t* row) const {
    uint32_t lo;
    uint16_t hi;
    std::memcpy(&lo, row, 4);
    std::memcpy(&hi, row + 4, 2);
    return Widen(lo, hi);
  }
  // lanes is 16 or 8 (head sizes are multiples of 8); fixed-size copies, as a copy of a
  // variable size is a library call per row.
  __m512 Values(const uint8_t* row, int32_t c0, int32_t lanes) const {
    const uint8_t* run = row + (c0 / 16) * 6;
    if (lanes == 16) return Keys(run);
    uint16_t lo;
    std::memcpy(&lo, run, 2);
    return _mm512_maskz_mov_ps(0xff, Widen(lo, run[2]));
  }
};

}  // namespace KVS_ISA
}  // namespace kvs::kv_simd
