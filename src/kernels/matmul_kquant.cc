// Q4_K, Q5_K and Q6_K weights times activations quantized to Q8_0 (int8 per 32 values, f16
// scale): integer dot products per 32 (Q4_K/Q5_K sub-block) or 16 (Q6_K scale group) values,
// scaled and summed in f32. Per-32 activation scales, finer than the per-256 ones ggml uses for
// these formats, keep one large activation from coarsening the codes of the other 224.
#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "kernels/matmul_internal.h"
#include "tensor/dtype.h"
#include "tensor/kquants.h"

#include "kernels/isa_begin.h"
#include "kernels/simd.h"

#if defined(KVS_ISA_AVX512)
#define KVS_MATMUL_KQUANT_AVX512 1
#endif

namespace kvs::matmul_internal::KVS_ISA {

#if KVS_MATMUL_KQUANT_AVX512 || defined(KVS_ISA_AVX2)

namespace {

// Which two 32-value sub-blocks vector k of a super-block holds (lanes 0-7 and 8-15). Paired
// order is how one 64-byte load of Q4_K/Q5_K nibbles splits: the low nibbles of qs[64h..64h+63]
// are sub-blocks 4h and 4h + 2, the high ones 4h + 1 and 4h + 3.
constexpr int kFirstSub[2][4] = {{0, 2, 4, 6}, {0, 1, 4, 5}};
constexpr int kSecondSub[2][4] = {{1, 3, 5, 7}, {2, 3, 6, 7}};

// Quantizes as QuantizeActivations does for Q8_0 weights (so activation codes and scales are
// those of a stored Q8_0 block), then regroups the 32-value blocks into the format's order. The
// code offset of 32 gives the lane biases Q6_K needs.
void QuantizeSuperBlock(const float* x, KActOrder order, KActBlock* dst) {
  ActPair pairs[4];
  KVS_ISA::QuantizeActivations(x, kSuperBlock, 32, pairs);
  const int o = static_cast<int>(order);
  for (int k = 0; k < 4; ++k) {
    for (int half = 0; half < 2; ++half) {
      const int sub = half == 0 ? kFirstSub[o][k] : kSecondSub[o][k];
      const ActPair& p = pairs[sub / 2];
      const int src = sub % 2;
      std::memcpy(dst->qs[k] + 32 * half, p.qs + 32 * src, 32);
      std::memcpy(dst->scale[k] + 8 * half, p.scale + 8 * src, 8 * sizeof(float));
      std::memcpy(dst->bias[k] + 8 * half, p.bias + 8 * src, 8 * sizeof(int32_t));
      int32_t bias_sum = 0;
      for (int lane = 0; lane < 8; ++lane) bias_sum += p.bias[8 * src + lane];
      dst->xsum[8 + sub] = p.scale[8 * src] * static_cast<float>(bias_sum / -32);
    }
  }
  std::fill_n(dst->xsum, 8, 0.0f);
}

}  // namespace

#endif

#if KVS_MATMUL_KQUANT_AVX512

namespace {

// Register tiles and prefetch distances as in matmul_quant.cc, where they were measured; here
// 4 x 6, 4 x 8 and 2 x 8 prefill tiles measured no better than 4 x 4.
constexpr int kTileRows = 4;
constexpr int kTileTokens = 4;
constexpr int kDecodeTileRows = 8;
constexpr size_t kMaxTilePrefetch = 32768;
constexpr size_t kRowPrefetch = 1024;

inline float Half(uint16_t h) {
  return _cvtsh_ss(h);
}

// What a format's Unpack gives for one super-block of one row: the unsigned codes of the four
// activation vectors, each dpbusd lane's weight scale, and the sub-block mins times dmin in
// lanes 8-15 (lanes 0-7 meet zeros in KActBlock::xsum).
struct Unpacked {
  __m512i codes[4];
  __m512 scales[4];
  __m512 mins;
};

// The 6-bit scales and mins of Q4_K/Q5_K as sixteen floats: scale j * d in lane j, min j * dmin
// in lane 8 + j. The bit layout is described at GetScaleMinK4 in kquants.cc; with its 12 bytes
// as words A, B, C, scales 0-3 are A & 63, mins 0-3 B & 63, scales 4-7 the low nibbles of C plus
// the top bits of A, mins 4-7 the high nibbles of C plus the top bits of B. Both formats start
// with d, dmin and those 12 bytes, so one 16-byte load holds all of them.
inline __m512 ScalesAndMinsK4(const void* block) {
  const __m128i v = _mm_loadu_si128(static_cast<const __m128i*>(block));
  const __m128i acbc = _mm_shuffle_epi32(v, _MM_SHUFFLE(3, 2, 3, 1));
  const __m128i aabb = _mm_shuffle_epi32(v, _MM_SHUFFLE(2, 2, 1, 1));
  const __m128i low = _mm_and_si128(_mm_srlv_epi32(acbc, _mm_set_epi32(4, 0, 0, 0)),
                                    _mm_set_epi32(0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f));
  const __m128i high =
      _mm_and_si128(_mm_srli_epi32(aabb, 2), _mm_set_epi32(0x30303030, 0, 0x30303030, 0));
  const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_or_si128(low, high)));
  const __m512 d_dmin = _mm512_zextps128_ps512(_mm_cvtph_ps(v));
  const __m512i pick = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
  return _mm512_mul_ps(f, _mm512_permutexvar_ps(pick, d_dmin));
}

inline void PairedLaneScales(__m512 sm, Unpacked* u) {
  for (int k = 0; k < 4; ++k) {
    const int a = kFirstSub[1][k], b = kSecondSub[1][k];
    const __m512i idx = _mm512_set_epi32(b, b, b, b, b, b, b, b, a, a, a, a, a, a, a, a);
    u->scales[k] = _mm512_permutexvar_ps(idx, sm);
  }
  u->mins = sm;
}

inline void NibbleCodes(const uint8_t* qs, Unpacked* u) {
  const __m512i mask = _mm512_set1_epi8(0x0f);
  for (int h = 0; h < 2; ++h) {
    const __m512i v = _mm512_loadu_si512(qs + 64 * h);
    u->codes[2 * h] = _mm512_and_si512(v, mask);
    u->codes[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
  }
}

struct Q4KFormat {
  using Block = BlockQ4_K;
  static constexpr bool kBias = false;
  static constexpr bool kMins = true;
  static void Unpack(const Block& b, Unpacked* u) {
    PairedLaneScales(ScalesAndMinsK4(&b), u);
    NibbleCodes(b.qs, u);
  }
};

struct Q5KFormat {
  using Block = BlockQ5_K;
  static constexpr bool kBias = false;
  static constexpr bool kMins = true;
  static void Unpack(const Block& b, Unpacked* u) {
    PairedLaneScales(ScalesAndMinsK4(&b), u);
    NibbleCodes(b.qs, u);
    // The fifth bit of sub-block s is bit s of qh[l]; with qh in both 256-bit halves, one
    // per-byte bit test serves the two sub-blocks of a vector.
    const __m512i qh =
        _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh)));
    for (int k = 0; k < 4; ++k) {
      const char a = static_cast<char>(1 << kFirstSub[1][k]);
      const char c = static_cast<char>(1 << kSecondSub[1][k]);
      const __m512i sel =
          _mm512_mask_blend_epi8(0xffffffff00000000ull, _mm512_set1_epi8(a), _mm512_set1_epi8(c));
      u->codes[k] = _mm512_mask_add_epi8(u->codes[k], _mm512_test_epi8_mask(qh, sel), u->codes[k],
                                         _mm512_set1_epi8(16));
    }
  }
};

struct Q6KFormat {
  using Block = BlockQ6_K;
  static constexpr bool kBias = true;
  static constexpr bool kMins = false;
  static void Unpack(const Block& b, Unpacked* u) {
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales));
    const __m512 sm =
        _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc8)), _mm512_set1_ps(Half(b.d)));
    // Natural order: lane L of vector k holds values 64k + 4L..64k + 4L + 3, scale group
    // 4k + L / 4.
    for (int k = 0; k < 4; ++k) {
      const int g = 4 * k;
      const __m512i idx = _mm512_set_epi32(g + 3, g + 3, g + 3, g + 3, g + 2, g + 2, g + 2, g + 2,
                                           g + 1, g + 1, g + 1, g + 1, g, g, g, g);
      u->scales[k] = _mm512_permutexvar_ps(idx, sm);
    }
    u->mins = _mm512_setzero_ps();
    // Half n: the low nibbles of ql[64n..64n+63] are values 128n + 0..63, the high ones
    // 128n + 64..127; their top bits are pairs 0-3 of qh[32n + l], taken for the upper 32 bytes
    // from qh shifted right by 2.
    const __m512i low4 = _mm512_set1_epi8(0x0f), top2 = _mm512_set1_epi8(0x30);
    for (int n = 0; n < 2; ++n) {
      const __m512i ql = _mm512_loadu_si512(b.ql + 64 * n);
      __m512i qh = _mm512_broadcast_i64x4(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * n)));
      qh = _mm512_mask_srli_epi16(qh, 0xffff0000u, qh, 2);
      u->codes[2 * n] = _mm512_or_si512(_mm512_and_si512(ql, low4),
                                        _mm512_and_si512(_mm512_slli_epi16(qh, 4), top2));
      u->codes[2 * n + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low4),
                                            _mm512_and_si512(qh, top2));
    }
  }
};

template <class F, int R, int T>
void Tile(const MatrixView& w, int64_t r0, const KQuantizedActs& a, int64_t t0, float* out,
          int64_t out_stride) {
  using Block = typename F::Block;
  const Block* rows[R];
  for (int i = 0; i < R; ++i) rows[i] = reinterpret_cast<const Block*>(w.row(r0 + i));
  const KActBlock* acts[T];
  for (int t = 0; t < T; ++t) acts[t] = a.token(t0 + t);
  __m512 acc[R][T];
  for (int i = 0; i < R; ++i)
    for (int t = 0; t < T; ++t) acc[i][t] = _mm512_setzero_ps();

  const size_t tile_bytes = R * w.row_bytes;
  const size_t prefetch_distance = tile_bytes <= kMaxTilePrefetch ? tile_bytes : kRowPrefetch;
  const int64_t n_blocks = w.cols / kSuperBlock;
  for (int64_t s = 0; s < n_blocks; ++s) {
    for (int i = 0; i < R; ++i) {
      const char* p = reinterpret_cast<const char*>(rows[i] + s) + prefetch_distance;
      for (size_t off = 0; off < sizeof(Block); off += 64) _mm_prefetch(p + off, _MM_HINT_T0);
    }
    // Unrolled, the rows' accumulation chains interleave; as a loop, each row waited on its
    // own chain of four FMAs per super-block (measured 25% faster decode, 15-30% prefill).
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      Unpacked u;
      F::Unpack(rows[i][s], &u);
      for (int t = 0; t < T; ++t) {
        const KActBlock& ab = acts[t][s];
        __m512 sum = acc[i][t];
        for (int k = 0; k < 4; ++k) {
          const __m512i start = F::kBias ? _mm512_load_si512(ab.bias[k]) : _mm512_setzero_si512();
          const __m512i dot = _mm512_dpbusd_epi32(start, u.codes[k], _mm512_load_si512(ab.qs[k]));
          sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot),
                                _mm512_mul_ps(u.scales[k], _mm512_load_ps(ab.scale[k])), sum);
        }
        if constexpr (F::kMins) sum = _mm512_fnmadd_ps(u.mins, _mm512_load_ps(ab.xsum), sum);
        acc[i][t] = sum;
      }
    }
  }
  for (int t = 0; t < T; ++t)
    for (int i = 0; i < R; ++i)
      out[(t0 + t) * out_stride + r0 + i] = _mm512_reduce_add_ps(acc[i][t]);
}

using TileFn = void (*)(const MatrixView&, int64_t, const KQuantizedActs&, int64_t, float*,
                        int64_t);

// The widest tile of at most nt tokens.
template <class F, int R, int T = kTileTokens>
TileFn PickTokens(int64_t nt) {
  if constexpr (T == 1) {
    return Tile<F, R, 1>;
  } else {
    return nt >= T ? Tile<F, R, T> : PickTokens<F, R, T - 1>(nt);
  }
}

template <class F>
void Rows(const MatrixView& w, int64_t r0, int64_t r1, const KQuantizedActs& a, int64_t t0,
          int64_t t1, float* out, int64_t out_stride) {
  for (int64_t t = t0; t < t1; t += kTileTokens) {
    const int64_t nt = std::min<int64_t>(kTileTokens, t1 - t);
    int64_t r = r0;
    if (nt == 1) {
      for (; r + kDecodeTileRows <= r1; r += kDecodeTileRows) {
        Tile<F, kDecodeTileRows, 1>(w, r, a, t, out, out_stride);
      }
    }
    const TileFn full = PickTokens<F, kTileRows>(nt);
    for (; r + kTileRows <= r1; r += kTileRows) full(w, r, a, t, out, out_stride);
    // Leftover rows one at a time: rare enough (row counts are mostly multiples of 16) not to
    // be worth more tile shapes.
    const TileFn single = PickTokens<F, 1>(nt);
    for (; r < r1; ++r) single(w, r, a, t, out, out_stride);
  }
}

}  // namespace

bool KQuantKernelAvailable(DType t) {
  return t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K;
}

void QuantizeActivationsK(const float* x, int64_t cols, KActOrder order, KActBlock* dst) {
  KVS_CHECK(cols % kSuperBlock == 0);
  for (int64_t b = 0; b < cols / kSuperBlock; ++b) {
    QuantizeSuperBlock(x + kSuperBlock * b, order, dst + b);
  }
}

void MatMulRowsKQuant(const MatrixView& w, int64_t r0, int64_t r1, const KQuantizedActs& a,
                      int64_t t0, int64_t t1, float* out, int64_t out_stride) {
  switch (w.type) {
    case DType::kQ4_K:
      return Rows<Q4KFormat>(w, r0, r1, a, t0, t1, out, out_stride);
    case DType::kQ5_K:
      return Rows<Q5KFormat>(w, r0, r1, a, t0, t1, out, out_stride);
    case DType::kQ6_K:
      return Rows<Q6KFormat>(w, r0, r1, a, t0, t1, out, out_stride);
    default:
      KVS_CHECK(false);
  }
}

#elif defined(KVS_ISA_AVX2)

#include "kernels/matmul_kquant_avx2.inc"

#else  // Without AVX-512 or AVX2 MatMul keeps dequantizing these formats row by row.

bool KQuantKernelAvailable(DType) {
  return false;
}

void QuantizeActivationsK(const float*, int64_t, KActOrder, KActBlock*) {
  KVS_CHECK(false);
}

void MatMulRowsKQuant(const MatrixView&, int64_t, int64_t, const KQuantizedActs&, int64_t, int64_t,
                      float*, int64_t) {
  KVS_CHECK(false);
}

#endif

}  // namespace kvs::matmul_internal::KVS_ISA

#include "kernels/isa_end.h"
