// The GGUF block formats beyond Q8_0/Q4_0 that llama-quantize writes for Q4_0 and Q4_K_M
// files (Q4_1, Q5_0, Q5_1 and the 256-value "K" super-blocks Q2_K..Q6_K): row dequantizers,
// plus simple quantizers for Q5_0 and Q4_K..Q6_K that tests and our GGUF writer use.
//
// The dequantizers are scalar reference code. Each value is computed with the same float
// operations in the same order as ggml's reference code, so that results can be compared with
// llama.cpp's exactly (barring FMA contraction).
// The quantizers use their own small search (no importance matrix); on Gaussian weights their
// error is on par with llama-quantize's reference quantizers.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace kvs {

inline constexpr int kSuperBlock = 256;  // values per K-quant block

// Layouts (packed, little-endian; f16 fields as raw bits). Within a 32-value block of the
// legacy formats, value j < 16 is in the low nibble of qs[j] and value j + 16 in its high nibble;
// the fifth bit of value j is bit j of qh (read as a little-endian uint32).
#pragma pack(push, 1)
struct BlockQ4_1 {
  uint16_t d;  // x = d * q + m, q in [0, 15]
  uint16_t m;
  uint8_t qs[16];
};
struct BlockQ5_0 {
  uint16_t d;  // x = d * (q - 16), q in [0, 31]
  uint8_t qh[4];
  uint8_t qs[16];
};
struct BlockQ5_1 {
  uint16_t d;  // x = d * q + m, q in [0, 31]
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[16];
};

// In Q2_K, Q3_K and Q6_K, value i of a super-block uses scale i / 16. The 2-bit fields of Q2_K
// and Q3_K: value i = 128 n + 32 j + l (l < 32) is bits 2j..2j+1 of qs[32 n + l].
struct BlockQ2_K {
  uint8_t scales[16];  // low nibble: scale, high nibble: min (both times d / dmin)
  uint8_t qs[64];
  uint16_t d;  // x = d * sc * q - dmin * m, q in [0, 3]
  uint16_t dmin;
};
struct BlockQ3_K {
  uint8_t hmask[32];   // bit i / 32 of hmask[i % 32] set: q = low bits, clear: q = low bits - 4
  uint8_t qs[64];      // low 2 bits, as in Q2_K
  uint8_t scales[12];  // sixteen 6-bit scales biased by 32; see Q3KScale in kquants.cc
  uint16_t d;          // x = d * (sc - 32) * q, q in [-4, 3]
};

// Q4_K and Q5_K: eight sub-blocks of 32 with 6-bit scales and mins packed into 12 bytes.
// Value i = 64 c + 32 h + l (l < 32) is nibble h of qs[32 c + l] and, in Q5_K, has its fifth
// bit at bit 2c + h (= i / 32) of qh[l].
struct BlockQ4_K {
  uint16_t d;  // x = d * sc * q - dmin * m, q in [0, 15]
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
struct BlockQ5_K {
  uint16_t d;  // x = d * sc * q - dmin * m, q in [0, 31]
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};

// Q6_K: value i = 128 n + 32 g + l (l < 32) has its low 4 bits in nibble g / 2 of
// ql[64 n + 32 (g % 2) + l] and its top 2 bits at bits 2g..2g+1 of qh[32 n + l].
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;  // x = d * sc * (q - 32), q in [0, 63]
};

// Q4_K/Q5_K pack eight 6-bit (scale, min) pairs into 12 bytes: pairs 0-3 sit in the low six
// bits of bytes 0-3 (scales) and 4-7 (mins); pairs 4-7 keep their low nibbles in bytes 8-11
// and their top two bits in the spare top bits of bytes 0-3 (scales) and 4-7 (mins).
inline void GetScaleMinK4(int j, const uint8_t* s, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// `s` must start zeroed; each pair only ORs in its own bits.
inline void SetScaleMinK4(int j, int sc, int m, uint8_t* s) {
  if (j < 4) {
    s[j] |= static_cast<uint8_t>(sc);
    s[j + 4] |= static_cast<uint8_t>(m);
  } else {
    s[j + 4] |= static_cast<uint8_t>((sc & 0xF) | ((m & 0xF) << 4));
    s[j - 4] |= static_cast<uint8_t>((sc >> 4) << 6);
    s[j] |= static_cast<uint8_t>((m >> 4) << 6);
  }
}

// Q6_K code i (0..63, value = d * scale * (code - 32)); see the layout note above. SetQ6KCode
// ORs the bits in, so the block's ql and qh must start zeroed.
inline int Q6KCode(const BlockQ6_K& b, int i) {
  const int half = i / 128, g = (i % 128) / 32, l = i % 32;
  const int low = (b.ql[64 * half + 32 * (g % 2) + l] >> (4 * (g / 2))) & 0xF;
  const int high = (b.qh[32 * half + l] >> (2 * g)) & 3;
  return low | (high << 4);
}
inline void SetQ6KCode(BlockQ6_K* b, int i, int code) {
  const int half = i / 128, g = (i % 128) / 32, l = i % 32;
  b->ql[64 * half + 32 * (g % 2) + l] |= static_cast<uint8_t>((code & 0xF) << (4 * (g / 2)));
  b->qh[32 * half + l] |= static_cast<uint8_t>((code >> 4) << (2 * g));
}

#pragma pack(pop)
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);

// Each converts n values (a multiple of the type's block size) at src into floats.
void DequantizeRowQ4_1(const void* src, float* dst, int64_t n);
void DequantizeRowQ5_0(const void* src, float* dst, int64_t n);
void DequantizeRowQ5_1(const void* src, float* dst, int64_t n);
void DequantizeRowQ2_K(const void* src, float* dst, int64_t n);
void DequantizeRowQ3_K(const void* src, float* dst, int64_t n);
void DequantizeRowQ4_K(const void* src, float* dst, int64_t n);
void DequantizeRowQ5_K(const void* src, float* dst, int64_t n);
void DequantizeRowQ6_K(const void* src, float* dst, int64_t n);

// Each converts n floats (a multiple of the type's block size) into blocks at dst
// (RowBytes(type, n) bytes). Non-finite inputs are not supported.
void QuantizeRowQ5_0(const float* src, void* dst, int64_t n);
void QuantizeRowQ4_K(const float* src, void* dst, int64_t n);
void QuantizeRowQ5_K(const float* src, void* dst, int64_t n);
void QuantizeRowQ6_K(const float* src, void* dst, int64_t n);

// Dispatch on t; false (nothing written) for types this file does not handle.
bool DequantizeRowKQuant(DType t, const void* src, float* dst, int64_t n);
bool QuantizeRowKQuant(DType t, const float* src, void* dst, int64_t n);

}  // namespace kvs
