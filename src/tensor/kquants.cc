#include "tensor/kquants.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/check.h"

namespace kvs {
namespace {

inline float Half(uint16_t h) {
  return F16ToF32(h);
}

inline uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Q3_K's sixteen 6-bit scales: low nibbles of scales 0-7 and 8-15 are the low and high nibbles
// of bytes 0-7; the top two bits of scale j are bits 2 (j / 4) of byte 8 + j % 4.
inline int Q3KScale(int j, const uint8_t* s) {
  const int low = j < 8 ? (s[j] & 0xF) : (s[j - 8] >> 4);
  const int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
  return low | (high << 4);
}

// ---------------------------------------------------------------------------------------------
// Quantizer search. Every fit models a group as x ~= s * q + b with integer q in [qmin, qmax]
// and scores candidates by the squared error of exactly what the decoder will compute.

// Nearest q for each x under (s, b); returns the squared reconstruction error.
float Assign(const float* x, int n, float s, float b, int qmin, int qmax, int* q) {
  const float inv = s != 0.0f ? 1.0f / s : 0.0f;
  float err = 0.0f;
  for (int i = 0; i < n; ++i) {
    // Clamp in float first so that a tiny s cannot overflow the integer conversion.
    const float t =
        std::clamp((x[i] - b) * inv, static_cast<float>(qmin), static_cast<float>(qmax));
    q[i] = static_cast<int>(std::lrint(t));
    const float r = s * q[i] + b;
    err += (x[i] - r) * (x[i] - r);
  }
  return err;
}

// Scale s for x ~= s * q (no offset), q in [qmin, qmax] with qmin = -(qmax + 1). The largest
// magnitude mapping to qmin uses the extra negative level; a few slightly smaller and larger
// scales (clipping or leaving headroom), each refined once by least squares, often do better.
float FitSymmetric(const float* x, int n, int qmin, int qmax) {
  float vmax = 0.0f;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > std::fabs(vmax)) vmax = x[i];
  }
  if (vmax == 0.0f) return 0.0f;
  KVS_CHECK(n <= 64);
  int q[64];
  float best_s = vmax / qmin;
  float best_err = Assign(x, n, best_s, 0.0f, qmin, qmax, q);
  for (int k = -4; k <= 8; ++k) {
    float s = vmax / (qmin - 0.25f * k);
    for (int pass = 0; pass < 2; ++pass) {
      const float err = Assign(x, n, s, 0.0f, qmin, qmax, q);
      if (err < best_err) {
        best_err = err;
        best_s = s;
      }
      double sxq = 0.0, sqq = 0.0;
      for (int i = 0; i < n; ++i) {
        sxq += static_cast<double>(x[i]) * q[i];
        sqq += static_cast<double>(q[i]) * q[i];
      }
      if (sqq == 0.0) break;
      s = static_cast<float>(sxq / sqq);
    }
  }
  return best_s;
}

struct Affine {
  float s;  // >= 0
  float b;  // <= 0, since the formats store -b as an unsigned "min"
};

// Least squares (s, b) for fixed q, with b held at or below 0; false when degenerate.
bool RefitAffine(const float* x, const int* q, int n, Affine* f) {
  double sq = 0.0, sqq = 0.0, sx = 0.0, sxq = 0.0;
  for (int i = 0; i < n; ++i) {
    sq += q[i];
    sqq += static_cast<double>(q[i]) * q[i];
    sx += x[i];
    sxq += static_cast<double>(x[i]) * q[i];
  }
  const double det = n * sqq - sq * sq;
  if (det <= 0.0) return false;
  double s = (n * sxq - sq * sx) / det;
  double b = (sqq * sx - sq * sxq) / det;
  if (b > 0.0) {
    b = 0.0;
    s = sxq / sqq;
  }
  if (s <= 0.0) return false;
  *f = {static_cast<float>(s), static_cast<float>(b)};
  return true;
}

// (s, b) for x ~= s * q + b, q in [0, qmax]: the range [min(x, 0), max(x)] split into qmax
// steps, give or take a little, each refined by least squares.
Affine FitAffine(const float* x, int n, int qmax) {
  float lo = 0.0f, hi = x[0];
  for (int i = 0; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  if (hi <= lo) return {0.0f, lo};  // all values equal lo <= 0: exact with q = 0
  KVS_CHECK(n <= 32);
  int q[32];
  Affine best{(hi - lo) / qmax, lo};
  float best_err = Assign(x, n, best.s, best.b, 0, qmax, q);
  for (int k = -4; k <= 8; ++k) {
    Affine f{(hi - lo) / (qmax + 0.25f * k), lo};
    for (int pass = 0; pass < 3; ++pass) {
      const float err = Assign(x, n, f.s, f.b, 0, qmax, q);
      if (err < best_err) {
        best_err = err;
        best = f;
      }
      if (!RefitAffine(x, q, n, &f)) break;
    }
  }
  return best;
}

// Quantizes one 256-value super-block into eight 32-value sub-blocks with 6-bit scales and mins
// (Q4_K: qmax 15, Q5_K: qmax 31). Fills d, dmin, the packed scales and the quants L.
void QuantizeAffineSuperBlock(const float* x, int qmax, uint16_t* d, uint16_t* dmin,
                              uint8_t* scales, int* L) {
  Affine fit[8];
  float max_s = 0.0f, max_m = 0.0f;
  for (int j = 0; j < 8; ++j) {
    fit[j] = FitAffine(x + 32 * j, 32, qmax);
    max_s = std::max(max_s, fit[j].s);
    max_m = std::max(max_m, -fit[j].b);
  }
  *d = F32ToF16(max_s / 63.0f);
  *dmin = F32ToF16(max_m / 63.0f);
  const float df = Half(*d), dminf = Half(*dmin);
  std::memset(scales, 0, 12);
  int q[32];
  for (int j = 0; j < 8; ++j) {
    // Rounding the scale and min to 6 bits separately is not optimal; try the neighbours too.
    const int sc0 = df > 0.0f ? std::min(63, static_cast<int>(std::lrint(fit[j].s / df))) : 0;
    const int m0 = dminf > 0.0f ? std::min(63, static_cast<int>(std::lrint(-fit[j].b / dminf))) : 0;
    float best_err = std::numeric_limits<float>::infinity();
    int best_sc = 0, best_m = 0;
    for (int sc = std::max(0, sc0 - 1); sc <= std::min(63, sc0 + 1); ++sc) {
      for (int m = std::max(0, m0 - 1); m <= std::min(63, m0 + 1); ++m) {
        const float err = Assign(x + 32 * j, 32, df * sc, -(dminf * m), 0, qmax, q);
        if (err < best_err) {
          best_err = err;
          best_sc = sc;
          best_m = m;
        }
      }
    }
    Assign(x + 32 * j, 32, df * best_sc, -(dminf * best_m), 0, qmax, L + 32 * j);
    SetScaleMinK4(j, best_sc, best_m, scales);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Dequantizers

void DequantizeRowQ4_1(const void* src, float* dst, int64_t n) {
  KVS_CHECK(n % 32 == 0);
  const BlockQ4_1* blocks = static_cast<const BlockQ4_1*>(src);
  for (int64_t b = 0; b < n / 32; ++b) {
    const BlockQ4_1& blk = blocks[b];
    const float d = Half(blk.d), m = Half(blk.m);
    float* y = dst + b * 32;
    for (int j = 0; j < 16; ++j) {
      y[j] = (blk.qs[j] & 0xF) * d + m;
      y[j + 16] = (blk.qs[j] >> 4) * d + m;
    }
  }
}

void DequantizeRowQ5_0(const void* src, float* dst, int64_t n) {
  KVS_CHECK(n % 32 == 0);
  const BlockQ5_0* blocks = static_cast<const BlockQ5_0*>(src);
  for (int64_t b = 0; b < n / 32; ++b) {
    const BlockQ5_0& blk = blocks[b];
    const float d = Half(blk.d);
    const uint32_t qh = LoadU32(blk.qh);
    float* y = dst + b * 32;
    for (int j = 0; j < 16; ++j) {
      const int q0 = (blk.qs[j] & 0xF) | (((qh >> j) & 1) << 4);
      const int q1 = (blk.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      y[j] = (q0 - 16) * d;
      y[j + 16] = (q1 - 16) * d;
    }
  }
}

void DequantizeRowQ5_1(const void* src, float* dst, int64_t n) {
  KVS_CHECK(n % 32 == 0);
  const BlockQ5_1* blocks = static_cast<const BlockQ5_1*>(src);
  for (int64_t b = 0; b < n / 32; ++b) {
    const BlockQ5_1& blk = blocks[b];
    const float d = Half(blk.d), m = Half(blk.m);
    const uint32_t qh = LoadU32(blk.qh);
    float* y = dst + b * 32;
    for (int j = 0; j < 16; ++j) {
      const int q0 = (blk.qs[j] & 0xF) | (((qh >> j) & 1) << 4);
      const int q1 = (blk.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      y[j] = q0 * d + m;
      y[j + 16] = q1 * d + m;
    }
  }
}

void DequantizeRowQ2_K(const void* src, float* dst, int64_t n) {
  KVS_CHECK(n % kSuperBlock == 0);
  const BlockQ2_K* blocks = static_cast<const BlockQ2_K*>(src);
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const BlockQ2_K& blk = blocks[b];
    const float d = Half(blk.d), dmin = Half(blk.dmin);
    float* y = dst + b * kSuperBlock;
    for (int half = 0; half < 2; ++half) {
      for (int j = 0; j < 4; ++j) {
        for (int l = 0; l < 32; ++l) {
          const int i = 128 * half + 32 * j + l;
          const uint8_t sc = blk.scales[i / 16];
          const float dl = d * (sc & 0xF), ml = dmin * (sc >> 4);
          const int q = (blk.qs[32 * half + l] >> (2 * j)) & 3;
          y[i] = dl * q - ml;
        }
      }
    }
  }
}

void DequantizeRowQ3_K(const void* src, float* dst, int64_t n) {
  KVS_CHECK(n % kSuperBlock == 0);
  const BlockQ3_K* blocks = static_cast<const BlockQ3_K*>(src);
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const BlockQ3_K& blk = blocks[b];
    const float d = Half(blk.d);
    float* y = dst + b * kSuperBlock;
    for (int half = 0; half < 2; ++half) {
      for (int j = 0; j < 4; ++j) {
        for (int l = 0; l < 32; ++l) {
          const int i = 128 * half + 32 * j + l;
          const float dl = d * (Q3KScale(i / 16, blk.scales) - 32);
          const int low = (blk.qs[32 * half + l] >> (2 * j)) & 3;
          const bool high = (blk.hmask[l] >> (i / 32)) & 1;
          y[i] = dl * (low - (high ? 0 : 4));
        }
      }
    }
  }
}

void DequantizeRowQ4_K(const void* src, float* dst, int64_t n) {
  KVS_CHECK(n % kSuperBlock == 0);
  const BlockQ4_K* blocks = static_cast<const BlockQ4_K*>(src);
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const BlockQ4_K& blk = blocks[b];
    const float d = Half(blk.d), dmin = Half(blk.dmin);
    float* y = dst + b * kSuperBlock;
    for (int sub = 0; sub < 8; ++sub) {  // sub = 2c + h: chunk c of 64 values, nibble h
      int sc, m;
      GetScaleMinK4(sub, blk.scales, &sc, &m);
      const float dl = d * sc, ml = dmin * m;
      const uint8_t* qs = blk.qs + 32 * (sub / 2);
      const int shift = 4 * (sub % 2);
      for (int l = 0; l < 32; ++l) y[32 * sub + l] = dl * ((qs[l] >> shift) & 0xF) - ml;
    }
  }
}

void DequantizeRowQ5_K(const void* src, float* dst, int64_t n) {
  KVS_CHECK(n % kSuperBlock == 0);
  const BlockQ5_K* blocks = static_cast<const BlockQ5_K*>(src);
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const BlockQ5_K& blk = blocks[b];
    const float d = Half(blk.d), dmin = Half(blk.dmin);
    float* y = dst + b * kSuperBlock;
    for (int sub = 0; sub < 8; ++sub) {
      int sc, m;
      GetScaleMinK4(sub, blk.scales, &sc, &m);
      const float dl = d * sc, ml = dmin * m;
      const uint8_t* qs = blk.qs + 32 * (sub / 2);
      const int shift = 4 * (sub % 2);
      for (int l = 0; l < 32; ++l) {
        const int q = ((qs[l] >> shift) & 0xF) | (((blk.qh[l] >> sub) & 1) << 4);
        y[32 * sub + l] = dl * q - ml;
      }
    }
  }
}

void DequantizeRowQ6_K(const void* src, float* dst, int64_t n) {
  KVS_CHECK(n % kSuperBlock == 0);
  const BlockQ6_K* blocks = static_cast<const BlockQ6_K*>(src);
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const BlockQ6_K& blk = blocks[b];
    const float d = Half(blk.d);
    float* y = dst + b * kSuperBlock;
    for (int half = 0; half < 2; ++half) {
      for (int g = 0; g < 4; ++g) {
        for (int l = 0; l < 32; ++l) {
          const int i = 128 * half + 32 * g + l;
          y[i] = d * blk.scales[i / 16] * (Q6KCode(blk, i) - 32);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Quantizers

void QuantizeRowQ5_0(const float* src, void* dst, int64_t n) {
  KVS_CHECK(n % 32 == 0);
  BlockQ5_0* blocks = static_cast<BlockQ5_0*>(dst);
  int q[32];
  for (int64_t b = 0; b < n / 32; ++b) {
    const float* x = src + b * 32;
    BlockQ5_0& blk = blocks[b];
    blk.d = F32ToF16(FitSymmetric(x, 32, -16, 15));
    Assign(x, 32, Half(blk.d), 0.0f, -16, 15, q);
    uint32_t qh = 0;
    for (int j = 0; j < 16; ++j) {
      const int q0 = q[j] + 16, q1 = q[j + 16] + 16;
      blk.qs[j] = static_cast<uint8_t>((q0 & 0xF) | ((q1 & 0xF) << 4));
      qh |= static_cast<uint32_t>(q0 >> 4) << j;
      qh |= static_cast<uint32_t>(q1 >> 4) << (j + 16);
    }
    std::memcpy(blk.qh, &qh, 4);
  }
}

void QuantizeRowQ4_K(const float* src, void* dst, int64_t n) {
  KVS_CHECK(n % kSuperBlock == 0);
  BlockQ4_K* blocks = static_cast<BlockQ4_K*>(dst);
  int L[kSuperBlock];
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    BlockQ4_K& blk = blocks[b];
    QuantizeAffineSuperBlock(src + b * kSuperBlock, 15, &blk.d, &blk.dmin, blk.scales, L);
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        blk.qs[32 * c + l] = static_cast<uint8_t>(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
      }
    }
  }
}

void QuantizeRowQ5_K(const float* src, void* dst, int64_t n) {
  KVS_CHECK(n % kSuperBlock == 0);
  BlockQ5_K* blocks = static_cast<BlockQ5_K*>(dst);
  int L[kSuperBlock];
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    BlockQ5_K& blk = blocks[b];
    QuantizeAffineSuperBlock(src + b * kSuperBlock, 31, &blk.d, &blk.dmin, blk.scales, L);
    std::memset(blk.qh, 0, sizeof(blk.qh));
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        const int lo = L[64 * c + l], hi = L[64 * c + 32 + l];
        blk.qs[32 * c + l] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
        blk.qh[l] |= static_cast<uint8_t>(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
      }
    }
  }
}

void QuantizeRowQ6_K(const float* src, void* dst, int64_t n) {
  KVS_CHECK(n % kSuperBlock == 0);
  BlockQ6_K* blocks = static_cast<BlockQ6_K*>(dst);
  int L[kSuperBlock];
  int q[16];
  for (int64_t b = 0; b < n / kSuperBlock; ++b) {
    const float* x = src + b * kSuperBlock;
    BlockQ6_K& blk = blocks[b];
    float s[16];
    float max_abs = 0.0f;
    for (int j = 0; j < 16; ++j) {
      s[j] = FitSymmetric(x + 16 * j, 16, -32, 31);
      max_abs = std::max(max_abs, std::fabs(s[j]));
    }
    blk.d = F32ToF16(max_abs / 127.0f);
    const float df = Half(blk.d);
    for (int j = 0; j < 16; ++j) {
      // As in QuantizeAffineSuperBlock, the neighbours of the rounded 8-bit scale may fit better.
      const int sc0 =
          df > 0.0f ? std::clamp(static_cast<int>(std::lrint(s[j] / df)), -128, 127) : 0;
      float best_err = std::numeric_limits<float>::infinity();
      int best_sc = 0;
      for (int sc = std::max(-128, sc0 - 1); sc <= std::min(127, sc0 + 1); ++sc) {
        const float err = Assign(x + 16 * j, 16, df * sc, 0.0f, -32, 31, q);
        if (err < best_err) {
          best_err = err;
          best_sc = sc;
        }
      }
      blk.scales[j] = static_cast<int8_t>(best_sc);
      Assign(x + 16 * j, 16, df * best_sc, 0.0f, -32, 31, L + 16 * j);
    }
    std::memset(blk.ql, 0, sizeof(blk.ql));
    std::memset(blk.qh, 0, sizeof(blk.qh));
    for (int i = 0; i < kSuperBlock; ++i) SetQ6KCode(&blk, i, L[i] + 32);
  }
}

// ---------------------------------------------------------------------------------------------
// Dispatch

bool DequantizeRowKQuant(DType t, const void* src, float* dst, int64_t n) {
  switch (t) {
    case DType::kQ4_1:
      DequantizeRowQ4_1(src, dst, n);
      return true;
    case DType::kQ5_0:
      DequantizeRowQ5_0(src, dst, n);
      return true;
    case DType::kQ5_1:
      DequantizeRowQ5_1(src, dst, n);
      return true;
    case DType::kQ2_K:
      DequantizeRowQ2_K(src, dst, n);
      return true;
    case DType::kQ3_K:
      DequantizeRowQ3_K(src, dst, n);
      return true;
    case DType::kQ4_K:
      DequantizeRowQ4_K(src, dst, n);
      return true;
    case DType::kQ5_K:
      DequantizeRowQ5_K(src, dst, n);
      return true;
    case DType::kQ6_K:
      DequantizeRowQ6_K(src, dst, n);
      return true;
    default:
      return false;
  }
}

bool QuantizeRowKQuant(DType t, const float* src, void* dst, int64_t n) {
  switch (t) {
    case DType::kQ5_0:
      QuantizeRowQ5_0(src, dst, n);
      return true;
    case DType::kQ4_K:
      QuantizeRowQ4_K(src, dst, n);
      return true;
    case DType::kQ5_K:
      QuantizeRowQ5_K(src, dst, n);
      return true;
    case DType::kQ6_K:
      QuantizeRowQ6_K(src, dst, n);
      return true;
    default:
      return false;
  }
}

}  // namespace kvs
