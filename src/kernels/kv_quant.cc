#include "kernels/kv_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "core/check.h"
#include "tensor/dtype.h"

namespace kvs {
namespace {

constexpr int32_t kMaxHeadDim = 1024;

// Lloyd-Max reconstruction levels for a unit Gaussian (Max, 1960): the MSE-optimal scalar
// quantizer for what a rotated head vector's coordinates look like.
constexpr float kTurbo4Levels[16] = {-2.7326f, -2.0690f, -1.6180f, -1.2562f, -0.9423f, -0.6568f,
                                     -0.3881f, -0.1284f, 0.1284f,  0.3881f,  0.6568f,  0.9423f,
                                     1.2562f,  1.6180f,  2.0690f,  2.7326f};
constexpr float kTurbo3Levels[16] = {-2.1519f, -1.3439f, -0.7560f, -0.2451f, 0.2451f, 0.7560f,
                                     1.3439f,  2.1519f,  0,        0,        0,       0,
                                     0,        0,        0,        0};
constexpr float kQ4_0Levels[16] = {-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7};

int32_t NumLevels(KvType t) {
  return t == KvType::kTurbo3 ? 8 : 16;
}

// Code of the level nearest to y (levels ascending).
int32_t NearestLevel(const float* levels, int32_t n_levels, float y) {
  int32_t code = 0;
  for (int32_t c = 1; c < n_levels; ++c) code += y > 0.5f * (levels[c - 1] + levels[c]);
  return code;
}

uint16_t RoundScale(float s) {
  return F32ToF16(s);
}

// --- code storage: bits >= 8 are plain arrays; 4-bit codes two per byte; 3-bit codes in runs
// of 16 (the last run of a row may be 8) as a 2-bit plane then a 1-bit plane.

void PutSubByteCode(uint8_t* row, int32_t m, int32_t i, uint32_t code, int32_t bits) {
  if (bits == 4) {
    uint8_t& b = row[i / 2];
    b = (i & 1) ? static_cast<uint8_t>((b & 0x0f) | (code << 4))
                : static_cast<uint8_t>((b & 0xf0) | code);
    return;
  }
  const int32_t run = i / 16, k = i % 16, len = std::min(16, m - 16 * run);
  uint8_t* lo = row + run * 6;
  uint8_t* hi = lo + len / 4;
  lo[k / 4] =
      static_cast<uint8_t>((lo[k / 4] & ~(3u << (2 * (k % 4)))) | ((code & 3u) << (2 * (k % 4))));
  hi[k / 8] =
      static_cast<uint8_t>((hi[k / 8] & ~(1u << (k % 8))) | (((code >> 2) & 1u) << (k % 8)));
}

uint32_t GetSubByteCode(const uint8_t* row, int32_t m, int32_t i, int32_t bits) {
  if (bits == 4) return (row[i / 2] >> (4 * (i & 1))) & 0x0f;
  const int32_t run = i / 16, k = i % 16, len = std::min(16, m - 16 * run);
  const uint8_t* lo = row + run * 6;
  const uint8_t* hi = lo + len / 4;
  return ((lo[k / 4] >> (2 * (k % 4))) & 3u) | (((hi[k / 8] >> (k % 8)) & 1u) << 2);
}

// Where element i of a "row" lives: a key row is one dim's 16 positions, a value row is one
// position's head_dim values.
struct RowRef {
  uint8_t* row;
  int32_t m;  // elements in the row
  int32_t i;  // element index
};

void PutCode(KvType t, RowRef r, uint32_t code) {
  const int32_t bits = KvCodeBits(t);
  switch (bits) {
    case 32:
      std::memcpy(r.row + 4 * r.i, &code, 4);
      return;
    case 16: {
      const uint16_t h = static_cast<uint16_t>(code);
      std::memcpy(r.row + 2 * r.i, &h, 2);
      return;
    }
    case 8:
      r.row[r.i] = static_cast<uint8_t>(code);
      return;
    default:
      PutSubByteCode(r.row, r.m, r.i, code, bits);
  }
}

uint32_t GetCode(KvType t, const uint8_t* row, int32_t m, int32_t i) {
  const int32_t bits = KvCodeBits(t);
  if (bits == 32) {
    uint32_t v;
    std::memcpy(&v, row + 4 * i, 4);
    return v;
  }
  if (bits == 16) {
    uint16_t v;
    std::memcpy(&v, row + 2 * i, 2);
    return v;
  }
  if (bits == 8) return row[i];
  return GetSubByteCode(row, m, i, bits);
}

float CodeValue(KvType t, uint32_t code) {
  switch (t) {
    case KvType::kF32: {
      float f;
      std::memcpy(&f, &code, 4);
      return f;
    }
    case KvType::kF16:
      return F16ToF32(static_cast<uint16_t>(code));
    case KvType::kBF16:
      return BF16ToF32(static_cast<uint16_t>(code));
    case KvType::kQ8_0:
    case KvType::kInt8:
      return static_cast<float>(static_cast<int8_t>(code));
    case KvType::kFp8:
      return E4m3ToF32(static_cast<uint8_t>(code));
    default:
      return KvCodebook(t)[code];
  }
}

uint32_t FloatCode(KvType t, float x) {
  switch (t) {
    case KvType::kF16:
      return F32ToF16(x);
    case KvType::kBF16:
      return F32ToBF16(x);
    default: {
      uint32_t v;
      std::memcpy(&v, &x, 4);
      return v;
    }
  }
}

// Squared error of coding x[g] with scale s, and the codes.
double CodebookError(const float* x, int32_t g, const float* levels, int32_t n_levels, float s,
                     uint32_t* codes) {
  double err = 0;
  const float inv = s != 0 ? 1.0f / s : 0.0f;
  for (int32_t i = 0; i < g; ++i) {
    codes[i] = static_cast<uint32_t>(NearestLevel(levels, n_levels, x[i] * inv));
    const double e = x[i] - s * levels[codes[i]];
    err += e * e;
  }
  return err;
}

// Turbo groups: the scale that minimises the squared error over a few starting points, each
// refined by one Lloyd step (the least-squares scale for the codes it chose).
float CodebookScale(const float* x, int32_t g, const float* levels, int32_t n_levels) {
  double ss = 0, amax = 0;
  for (int32_t i = 0; i < g; ++i) {
    ss += static_cast<double>(x[i]) * x[i];
    amax = std::max(amax, static_cast<double>(std::fabs(x[i])));
  }
  if (amax == 0) return 0;
  const float rms = static_cast<float>(std::sqrt(ss / g));
  const float candidates[] = {rms * 0.85f, rms, rms * 1.15f,
                              static_cast<float>(amax) / levels[n_levels - 1]};
  uint32_t codes[kMaxHeadDim];
  float best = candidates[0];
  double best_err = INFINITY;
  for (float s : candidates) {
    for (int step = 0; step < 2; ++step) {
      const double err = CodebookError(x, g, levels, n_levels, s, codes);
      if (err < best_err) {
        best_err = err;
        best = s;
      }
      double xc = 0, cc = 0;
      for (int32_t i = 0; i < g; ++i) {
        xc += static_cast<double>(x[i]) * levels[codes[i]];
        cc += static_cast<double>(levels[codes[i]]) * levels[codes[i]];
      }
      if (cc == 0) break;
      s = static_cast<float>(xc / cc);
    }
  }
  return best;
}

// 8-bit groups: round-to-nearest on a grid set by the extreme value wastes the grid's ends on
// one element. Try a few narrower grids (the extreme then clips by a fraction of a step), each
// refined once to the least-squares scale for its codes, and keep the least squared error.
float UniformScale(const float* x, int32_t g, float amax, float q_max) {
  if (amax == 0) return 0;
  float best = amax / q_max;
  double best_err = INFINITY;
  for (float shrink : {1.0f, 0.97f, 0.94f, 0.91f}) {
    float s = amax * shrink / q_max;
    for (int step = 0; step < 2; ++step) {
      const float inv = 1.0f / s;
      double err = 0, xc = 0, cc = 0;
      for (int32_t i = 0; i < g; ++i) {
        const float c = std::clamp(std::nearbyint(x[i] * inv), -q_max, q_max);
        const double d = x[i] - c * s;
        err += d * d;
        xc += static_cast<double>(x[i]) * c;
        cc += static_cast<double>(c) * c;
      }
      if (err < best_err) {
        best_err = err;
        best = s;
      }
      if (cc == 0) break;
      s = static_cast<float>(xc / cc);
    }
  }
  return best;
}

// Codes and f16 scale of one group x[g].
uint16_t QuantizeGroup(KvType t, const float* x, int32_t g, uint32_t* codes) {
  float amax = 0, signed_max = 0;
  for (int32_t i = 0; i < g; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      signed_max = x[i];
    }
  }
  float scale = 0;
  switch (t) {
    case KvType::kQ8_0:
    case KvType::kInt8:
      scale = UniformScale(x, g, amax, 127.0f);
      break;
    case KvType::kFp8:
      scale = amax / 448.0f;
      break;
    case KvType::kQ4_0:
      scale = signed_max / -8.0f;  // GGML's q4_0: the extreme value maps to code 0 (-8)
      break;
    default:
      scale = CodebookScale(x, g, KvCodebook(t), NumLevels(t));
  }
  const uint16_t scale_f16 = RoundScale(scale);
  const float s = F16ToF32(scale_f16);
  const float inv = s != 0 ? 1.0f / s : 0.0f;
  for (int32_t i = 0; i < g; ++i) {
    const float y = x[i] * inv;
    switch (t) {
      case KvType::kQ8_0:
      case KvType::kInt8:
        codes[i] = static_cast<uint8_t>(
            static_cast<int8_t>(std::clamp(std::nearbyint(y), -127.0f, 127.0f)));
        break;
      case KvType::kFp8:
        codes[i] = F32ToE4m3(std::clamp(y, -448.0f, 448.0f));
        break;
      case KvType::kQ4_0:
        codes[i] = static_cast<uint32_t>(std::clamp(static_cast<int>(y + 8.5f), 0, 15));
        break;
      default:
        codes[i] = static_cast<uint32_t>(NearestLevel(KvCodebook(t), NumLevels(t), y));
    }
  }
  return scale_f16;
}

// Codes of a head vector, and its group scales; returns the group size (0: no scales).
int32_t Quantize(KvType t, const float* x_in, int32_t n, uint32_t* codes, uint16_t* scales) {
  KVS_CHECK_MSG(n <= kMaxHeadDim, "head size above 1024");
  float rotated[kMaxHeadDim];
  const float* x = x_in;
  if (KvTypeIsRotated(t)) {
    std::copy(x_in, x_in + n, rotated);
    RotateForward(rotated, n);
    x = rotated;
  }
  const int32_t g = KvGroupSize(t, n);
  if (g == 0) {
    for (int32_t i = 0; i < n; ++i) codes[i] = FloatCode(t, x[i]);
    return 0;
  }
  for (int32_t j = 0; j < n / g; ++j) scales[j] = QuantizeGroup(t, x + j * g, g, codes + j * g);
  return g;
}

float ScaleAt(const uint8_t* p, size_t index) {
  uint16_t h;
  std::memcpy(&h, p + 2 * index, 2);
  return F16ToF32(h);
}

void PutScale(uint8_t* p, size_t index, uint16_t h) {
  std::memcpy(p + 2 * index, &h, 2);
}

size_t KeyRowBytes(KvType t) {
  return 16 * static_cast<size_t>(KvCodeBits(t)) / 8;
}

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

bool FlipSign(int32_t i) {
  return SplitMix64(0x6b7673657276ull + static_cast<uint64_t>(i)) & 1;
}

void HadamardBlocks(float* x, int32_t n) {
  const int32_t p = n & -n;  // largest power of two dividing n
  const float norm = 1.0f / std::sqrt(static_cast<float>(p));
  for (int32_t base = 0; base < n; base += p) {
    float* v = x + base;
    for (int32_t len = 1; len < p; len *= 2) {
      for (int32_t i = 0; i < p; i += 2 * len) {
        for (int32_t j = i; j < i + len; ++j) {
          const float a = v[j], b = v[j + len];
          v[j] = a + b;
          v[j + len] = a - b;
        }
      }
    }
    for (int32_t i = 0; i < p; ++i) v[i] *= norm;
  }
}

}  // namespace

const float* KvCodebook(KvType t) {
  switch (t) {
    case KvType::kQ4_0:
      return kQ4_0Levels;
    case KvType::kTurbo4:
      return kTurbo4Levels;
    case KvType::kTurbo3:
      return kTurbo3Levels;
    default:
      return nullptr;
  }
}

float E4m3ToF32(uint8_t b) {
  const int32_t e = (b >> 3) & 15, m = b & 7;
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m), -9)
                           : std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
  return (b & 0x80) ? -mag : mag;
}

uint8_t F32ToE4m3(float x) {
  const float a = std::min(std::fabs(x), 448.0f);
  // Positive codes 0..126 increase with their value: binary search, then the nearer neighbour.
  int32_t lo = 0, hi = 126;
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) / 2;
    if (E4m3ToF32(static_cast<uint8_t>(mid)) <= a) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  int32_t code = lo;
  if (lo < 126) {
    const float below = a - E4m3ToF32(static_cast<uint8_t>(lo));
    const float above = E4m3ToF32(static_cast<uint8_t>(lo + 1)) - a;
    if (above < below || (above == below && (lo & 1))) code = lo + 1;
  }
  return static_cast<uint8_t>(code | (x < 0 ? 0x80 : 0));
}

void RotateForward(float* x, int32_t n) {
  for (int32_t i = 0; i < n; ++i) {
    if (FlipSign(i)) x[i] = -x[i];
  }
  HadamardBlocks(x, n);
}

void RotateBack(float* x, int32_t n) {
  HadamardBlocks(x, n);  // each normalized Hadamard block is its own inverse
  for (int32_t i = 0; i < n; ++i) {
    if (FlipSign(i)) x[i] = -x[i];
  }
}

// f16 codes of x[n], with the CPU's converter where it has one: round to nearest even as
// F32ToF16 (a NaN keeps its payload's top bits there; both give a NaN).
void F16Codes(const float* x, int32_t n, uint16_t* out) {
  int32_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    // The masked form: GCC 12's plain _mm512_cvtps_ph reads an undefined register (a
    // -Wmaybe-uninitialized false alarm).
    const __m256i h = _mm512_maskz_cvtps_ph(0xffff, _mm512_loadu_ps(x + i),
                                            _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), h);
  }
#endif
  for (; i < n; ++i) out[i] = F32ToF16(x[i]);
}

void StoreKey(KvType t, uint8_t* head_block, int32_t n, int32_t pos, const float* x) {
  if (t == KvType::kF16) {  // the common cache type: no codes array, no per-element switch
    KVS_CHECK_MSG(n <= kMaxHeadDim, "head size above 1024");
    uint16_t h[kMaxHeadDim];
    F16Codes(x, n, h);
    for (int32_t d = 0; d < n; ++d) std::memcpy(head_block + 32 * d + 2 * pos, &h[d], 2);
    return;
  }
  uint32_t codes[kMaxHeadDim];
  uint16_t scales[kMaxHeadDim];
  const int32_t g = Quantize(t, x, n, codes, scales);
  const size_t row_bytes = KeyRowBytes(t);
  for (int32_t d = 0; d < n; ++d) PutCode(t, {head_block + d * row_bytes, 16, pos}, codes[d]);
  uint8_t* scale_base = head_block + n * row_bytes;
  for (int32_t j = 0; g != 0 && j < n / g; ++j) PutScale(scale_base, j * 16 + pos, scales[j]);
}

void StoreValue(KvType t, uint8_t* head_block, int32_t n, int32_t pos, const float* x) {
  if (t == KvType::kF16) {
    uint16_t* row = reinterpret_cast<uint16_t*>(head_block + pos * KvValueRowBytes(t, n));
    F16Codes(x, n, row);
    return;
  }
  uint32_t codes[kMaxHeadDim];
  uint16_t scales[kMaxHeadDim];
  const int32_t g = Quantize(t, x, n, codes, scales);
  const size_t row_bytes = KvValueRowBytes(t, n);
  uint8_t* row = head_block + pos * row_bytes;
  for (int32_t d = 0; d < n; ++d) PutCode(t, {row, n, d}, codes[d]);
  uint8_t* scale_base = head_block + 16 * row_bytes;
  for (int32_t j = 0; g != 0 && j < n / g; ++j) PutScale(scale_base, pos * (n / g) + j, scales[j]);
}

void MoveKey(KvType t, const uint8_t* src_block, int32_t src_pos, uint8_t* dst_block,
             int32_t dst_pos, int32_t n, int32_t len) {
  if (len <= 0 || (src_block == dst_block && src_pos == dst_pos)) return;
  const size_t row_bytes = KeyRowBytes(t);
  const int32_t bits = KvCodeBits(t);
  if (bits % 8 == 0) {
    // Whole-byte codes: a dimension's codes of consecutive positions are consecutive bytes.
    const size_t code_bytes = static_cast<size_t>(bits / 8);
    for (int32_t d = 0; d < n; ++d) {
      std::memmove(dst_block + d * row_bytes + dst_pos * code_bytes,
                   src_block + d * row_bytes + src_pos * code_bytes, len * code_bytes);
    }
  } else {
    // Sub-byte codes share bytes with their neighbours: one code at a time, in the order that
    // never overwrites a code before it is read (dst before src: ascending).
    for (int32_t i = 0; i < len; ++i) {
      for (int32_t d = 0; d < n; ++d) {
        const uint32_t code = GetCode(t, src_block + d * row_bytes, 16, src_pos + i);
        PutCode(t, {dst_block + d * row_bytes, 16, dst_pos + i}, code);
      }
    }
  }
  const int32_t g = KvGroupSize(t, n);
  for (int32_t j = 0; g != 0 && j < n / g; ++j) {
    std::memmove(dst_block + n * row_bytes + 2 * (j * 16 + dst_pos),
                 src_block + n * row_bytes + 2 * (j * 16 + src_pos), 2 * static_cast<size_t>(len));
  }
}

void MoveValue(KvType t, const uint8_t* src_block, int32_t src_pos, uint8_t* dst_block,
               int32_t dst_pos, int32_t n, int32_t len) {
  if (len <= 0 || (src_block == dst_block && src_pos == dst_pos)) return;
  const size_t row_bytes = KvValueRowBytes(t, n);
  std::memmove(dst_block + dst_pos * row_bytes, src_block + src_pos * row_bytes, len * row_bytes);
  const int32_t g = KvGroupSize(t, n);
  if (g == 0) return;
  const size_t scale_bytes = 2 * static_cast<size_t>(n / g);
  std::memmove(dst_block + 16 * row_bytes + dst_pos * scale_bytes,
               src_block + 16 * row_bytes + src_pos * scale_bytes, len * scale_bytes);
}

float LoadKey(KvType t, const uint8_t* head_block, int32_t n, int32_t dim, int32_t pos) {
  const size_t row_bytes = KeyRowBytes(t);
  const float v = CodeValue(t, GetCode(t, head_block + dim * row_bytes, 16, pos));
  const int32_t g = KvGroupSize(t, n);
  return g == 0 ? v : v * ScaleAt(head_block + n * row_bytes, (dim / g) * 16 + pos);
}

float LoadValue(KvType t, const uint8_t* head_block, int32_t n, int32_t pos, int32_t dim) {
  const size_t row_bytes = KvValueRowBytes(t, n);
  const float v = CodeValue(t, GetCode(t, head_block + pos * row_bytes, n, dim));
  const int32_t g = KvGroupSize(t, n);
  return g == 0 ? v : v * ScaleAt(head_block + 16 * row_bytes, pos * (n / g) + dim / g);
}

void LoadKeyVector(KvType t, const uint8_t* head_block, int32_t n, int32_t pos, float* x) {
  const size_t row_bytes = KeyRowBytes(t);
  const int32_t g = KvGroupSize(t, n);
  const uint8_t* scales = head_block + n * row_bytes;
  for (int32_t dim = 0; dim < n; ++dim) {
    const float v = CodeValue(t, GetCode(t, head_block + dim * row_bytes, 16, pos));
    x[dim] = g == 0 ? v : v * ScaleAt(scales, (dim / g) * 16 + pos);
  }
}

void LoadValueVector(KvType t, const uint8_t* head_block, int32_t n, int32_t pos, float* x) {
  const size_t row_bytes = KvValueRowBytes(t, n);
  const int32_t g = KvGroupSize(t, n);
  const uint8_t* row = head_block + pos * row_bytes;
  const uint8_t* scales = head_block + 16 * row_bytes;
  for (int32_t dim = 0; dim < n; ++dim) {
    const float v = CodeValue(t, GetCode(t, row, n, dim));
    x[dim] = g == 0 ? v : v * ScaleAt(scales, pos * (n / g) + dim / g);
  }
}

}  // namespace kvs
