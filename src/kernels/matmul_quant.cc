// Q8_0, Q4_0 and Q5_0 weights times activations quantized to Q8_0: integer dot products per
// 32-value block, scaled and summed in f32 (the scheme ggml uses, so numerics are comparable with
// the peer's).
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "core/check.h"
#include "kernels/matmul_internal.h"
#include "tensor/dtype.h"
#include "tensor/kquants.h"
#include "tensor/quantize.h"

#include "kernels/isa_begin.h"
#include "kernels/simd.h"

#if defined(KVS_ISA_AVX512)
#define KVS_MATMUL_AVX512 1
#endif

namespace kvs::matmul_internal::KVS_ISA {
namespace {

#if KVS_MATMUL_AVX512

// Rows x tokens per register tile. 4 x 4 keeps 16 accumulators plus the loaded operands within
// the 32 zmm registers; a weight pair is unpacked once and used for four tokens.
constexpr int kTileRows = 4;
constexpr int kTileTokens = 4;
// A lone token (decode) takes 8 rows at a time: more rows stream from memory at once, which
// measured 20-35% faster than 4 on Zen 5; 12 or 16 spill registers.
constexpr int kDecodeTileRows = 8;
// Software prefetch of the weights: the hardware prefetcher alone left decode well below the
// bandwidth of a plain row stream, and far below it for short rows, whose streams end before it
// ramps up. Short rows are prefetched at the same position in the next tile's rows (R rows on),
// long ones a fixed distance ahead in the same row; both measured best among the distances tried.
constexpr size_t kMaxTilePrefetch = 32768;
constexpr size_t kRowPrefetch = 1024;

// Rounds to the nearest integer with ties away from zero, like std::round in QuantizeRow, so
// activation codes match a stored Q8_0 block bit for bit.
inline __m512i RoundAwayToInt(__m512 v) {
  __m512 t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  __m512 frac = _mm512_sub_ps(v, t);  // exact
  __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(frac), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
  __m512i sign = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(INT32_MIN));
  __m512 one =
      _mm512_castsi512_ps(_mm512_or_si512(sign, _mm512_castps_si512(_mm512_set1_ps(1.0f))));
  return _mm512_cvttps_epi32(_mm512_mask_add_ps(t, up, t, one));
}

void QuantizeBlock(const float* x, int32_t code_offset, ActPair* p, int half) {
  __m512 v0 = _mm512_loadu_ps(x), v1 = _mm512_loadu_ps(x + 16);
  // max_ps gives its second operand where either is NaN: NaNs are skipped, as by the twin's
  // std::max (their codes are 0: cvtt gives INT_MIN, whose low byte cvtepi32_epi8 keeps).
  const float amax = _mm512_reduce_max_ps(
      _mm512_max_ps(_mm512_abs_ps(v0), _mm512_max_ps(_mm512_abs_ps(v1), _mm512_setzero_ps())));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  __m512i q0 = RoundAwayToInt(_mm512_mul_ps(v0, _mm512_set1_ps(id)));
  __m512i q1 = RoundAwayToInt(_mm512_mul_ps(v1, _mm512_set1_ps(id)));
  const __m256i q = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_cvtepi32_epi8(q0)),
                                            _mm512_cvtepi32_epi8(q1), 1);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p->qs + 32 * half), q);
  const float d16 = _cvtsh_ss(_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));
  _mm256_storeu_ps(p->scale + 8 * half, _mm256_set1_ps(d16));
  // Sums of each lane's four codes, by the same instruction the kernels use.
  const __m256i lane_sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1), q);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p->bias + 8 * half),
                      _mm256_mullo_epi32(lane_sums, _mm256_set1_epi32(-code_offset)));
}

#elif defined(KVS_ISA_AVX2)

// std::round (halves away from zero) of 8 floats, as int32, and 0 where v is not finite: the
// scalar twin's codes exactly.
inline __m256i RoundAwayToInt(__m256 v) {
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m256 frac = _mm256_andnot_ps(sign_bit, _mm256_sub_ps(v, t));  // |v - t|, exact
  const __m256 up = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
  const __m256 one = _mm256_or_ps(_mm256_and_ps(v, sign_bit), _mm256_set1_ps(1.0f));
  const __m256 finite =
      _mm256_cmp_ps(_mm256_andnot_ps(sign_bit, v), _mm256_set1_ps(INFINITY), _CMP_LT_OQ);
  return _mm256_and_si256(_mm256_cvttps_epi32(_mm256_add_ps(t, _mm256_and_ps(up, one))),
                          _mm256_castps_si256(finite));
}

// QuantizeRow(kQ8_0)'s block, vectorized with the same arithmetic (one multiply by 1 / d, round
// half away from zero), so both give the same codes and scale.
void QuantizeBlock(const float* x, int32_t code_offset, ActPair* p, int half) {
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  __m256 v[4];
  __m256 amax8 = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(x + 8 * i);
    amax8 = _mm256_max_ps(_mm256_andnot_ps(sign_bit, v[i]), amax8);  // skips a NaN, as std::max
  }
  const float amax = simd::ReduceMax8(amax8);
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  __m256i q[4];
  for (int i = 0; i < 4; ++i) q[i] = RoundAwayToInt(_mm256_mul_ps(v[i], _mm256_set1_ps(id)));
  const __m256i codes = simd::PackInt32ToInt8(q);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p->qs + 32 * half), codes);
  const float d16 = _cvtsh_ss(_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));
  _mm256_storeu_ps(p->scale + 8 * half, _mm256_set1_ps(d16));
  const __m256i lane_sums = simd::DotU8S8(_mm256_set1_epi8(1), codes);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p->bias + 8 * half),
                      _mm256_mullo_epi32(lane_sums, _mm256_set1_epi32(-code_offset)));
}

#else

void QuantizeBlock(const float* x, int32_t code_offset, ActPair* p, int half) {
  BlockQ8_0 b;
  QuantizeRow(DType::kQ8_0, x, &b, 32);
  std::memcpy(p->qs + 32 * half, b.qs, 32);
  std::fill_n(p->scale + 8 * half, 8, F16ToF32(b.d));
  for (int lane = 0; lane < 8; ++lane) {
    const int8_t* q = b.qs + 4 * lane;
    p->bias[8 * half + lane] = -code_offset * (q[0] + q[1] + q[2] + q[3]);
  }
}

#endif

}  // namespace

void QuantizeActivations(const float* x, int64_t cols, int32_t code_offset, ActPair* dst) {
  KVS_CHECK(cols % 32 == 0);
  const int64_t n_blocks = cols / 32;
  for (int64_t b = 0; b < n_blocks; ++b) {
    QuantizeBlock(x + 32 * b, code_offset, &dst[b / 2], static_cast<int>(b & 1));
  }
  if (n_blocks & 1) {
    // The kernels run over whole pairs; a zero half adds nothing whatever the weights hold.
    ActPair& last = dst[n_blocks / 2];
    std::memset(last.qs + 32, 0, 32);
    std::fill_n(last.scale + 8, 8, 0.0f);
    std::fill_n(last.bias + 8, 8, 0);
  }
}

void QuantizeActivationsFlat(const float* x, int64_t cols, int32_t code_offset, ActBlock* dst) {
  KVS_CHECK(cols % 32 == 0);
  ActPair pair;
  for (int64_t b = 0; b < cols / 32; ++b) {
    QuantizeBlock(x + 32 * b, code_offset, &pair, 0);
    std::memcpy(dst[b].qs, pair.qs, 32);
    dst[b].scale = pair.scale[0];
    int32_t bias = 0;
    for (int lane = 0; lane < 8; ++lane) bias += pair.bias[lane];
    dst[b].bias = bias;
  }
}

namespace {

#if KVS_MATMUL_AVX512

// Weight formats for the tile kernel: codes of two consecutive blocks as unsigned bytes in
// activation order, and their f16 scales widened to the dpbusd lanes of each block.
struct Q8_0Format {
  using Block = BlockQ8_0;
  static __m512i Codes(const Block* b) {
    __m512i v =
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[0].qs)));
    v = _mm512_inserti64x4(v, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[1].qs)), 1);
    return _mm512_xor_si512(v, _mm512_set1_epi8(static_cast<char>(0x80)));
  }
  static __m512i CodesLast(const Block* b) {
    __m512i v =
        _mm512_zextsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[0].qs)));
    return _mm512_xor_si512(v, _mm512_set1_epi8(static_cast<char>(0x80)));
  }
  // The 64 bytes at b hold d0 as word 0 and d1 as word 17 (blocks are 34 bytes).
  static __m512 Scales(const Block* b) { return Widen(_mm512_loadu_si512(b)); }
  static __m512 ScalesLast(const Block* b) { return Widen(_mm512_maskz_loadu_epi16(1, b)); }
  static __m512 Widen(__m512i raw) {
    const __m512i idx = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 17, 17, 17,
                                         17, 17, 17, 17, 17, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(idx, raw)));
  }
};

struct Q4_0Format {
  using Block = BlockQ4_0;
  // Low nibbles are values 0..15 of a block, high nibbles 16..31: 128-bit lanes 0 and 2 take
  // the low nibbles, lanes 1 and 3 the high ones.
  static __m512i Codes(const Block* b) {
    __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b[0].qs)));
    v = _mm512_mask_broadcast_i32x4(v, 0xff00,
                                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[1].qs)));
    return Nibbles(v);
  }
  static __m512i CodesLast(const Block* b) {
    return Nibbles(_mm512_maskz_broadcast_i32x4(
        0x00ff, _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[0].qs))));
  }
  static __m512i Nibbles(__m512i v) {
    v = _mm512_mask_srli_epi16(v, 0xff00ff00u, v, 4);
    return _mm512_and_si512(v, _mm512_set1_epi8(0x0f));
  }
  // The 32 bytes at b hold d0 as word 0 and d1 as word 9 (blocks are 18 bytes).
  static __m512 Scales(const Block* b) {
    return Widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
  }
  static __m512 ScalesLast(const Block* b) { return Widen(_mm256_maskz_loadu_epi16(1, b)); }
  static __m512 Widen(__m256i raw) {
    const __m256i idx = _mm256_set_epi16(9, 9, 9, 9, 9, 9, 9, 9, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_cvtph_ps(_mm256_permutexvar_epi16(idx, raw));
  }
};

// Q5_0 is Q4_0 with a fifth bit per value: bit j of qh is bit 4 of value j, and in the
// unpacked pair value j of the first block is byte j, of the second byte 32 + j.
struct Q5_0Format {
  using Block = BlockQ5_0;
  static __m512i Codes(const Block* b) {
    __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b[0].qs)));
    v = _mm512_mask_broadcast_i32x4(v, 0xff00,
                                    _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[1].qs)));
    return HighBits(Q4_0Format::Nibbles(v), QhBits(b[0]) | (QhBits(b[1]) << 32));
  }
  static __m512i CodesLast(const Block* b) {
    const __m512i v = Q4_0Format::Nibbles(_mm512_maskz_broadcast_i32x4(
        0x00ff, _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[0].qs))));
    return HighBits(v, QhBits(b[0]));
  }
  static uint64_t QhBits(const Block& b) {
    uint32_t qh;
    std::memcpy(&qh, b.qh, 4);
    return qh;
  }
  static __m512i HighBits(__m512i v, uint64_t qh) {
    return _mm512_mask_add_epi8(v, _cvtu64_mask64(qh), v, _mm512_set1_epi8(16));
  }
  // The 32 bytes at b hold d0 as word 0 and d1 as word 11 (blocks are 22 bytes).
  static __m512 Scales(const Block* b) {
    return Widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
  }
  static __m512 ScalesLast(const Block* b) { return Widen(_mm256_maskz_loadu_epi16(1, b)); }
  static __m512 Widen(__m256i raw) {
    const __m256i idx = _mm256_set_epi16(11, 11, 11, 11, 11, 11, 11, 11, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_cvtph_ps(_mm256_permutexvar_epi16(idx, raw));
  }
};

// Left alone, GCC folds activation loads into each of the R instructions that use them, issuing
// the same load R times, and loads then limit the tile.
template <class V>
inline void KeepInRegister(V& v) {
  asm("" : "+v"(v));
}

template <class F, int R, int T>
void Tile(const MatrixView& w, int64_t r0, const QuantizedActs& a, int64_t t0, float* out,
          int64_t out_stride) {
  using Block = typename F::Block;
  const Block* rows[R];
  for (int i = 0; i < R; ++i) rows[i] = reinterpret_cast<const Block*>(w.row(r0 + i));
  const ActPair* acts[T];
  for (int t = 0; t < T; ++t) acts[t] = a.token(t0 + t);
  __m512 acc[R][T];
  for (int i = 0; i < R; ++i)
    for (int t = 0; t < T; ++t) acc[i][t] = _mm512_setzero_ps();

  const size_t tile_bytes = R * w.row_bytes;
  const size_t prefetch_distance = tile_bytes <= kMaxTilePrefetch ? tile_bytes : kRowPrefetch;
  auto step = [&](int64_t p, auto last) __attribute__((always_inline)) {
    __m512i wc[R];
    __m512 ws[R];
    for (int i = 0; i < R; ++i) {
      _mm_prefetch(reinterpret_cast<const char*>(rows[i] + 2 * p) + prefetch_distance, _MM_HINT_T0);
    }
    for (int i = 0; i < R; ++i) {
      if constexpr (last) {
        wc[i] = F::CodesLast(rows[i] + 2 * p);
        ws[i] = F::ScalesLast(rows[i] + 2 * p);
      } else {
        wc[i] = F::Codes(rows[i] + 2 * p);
        ws[i] = F::Scales(rows[i] + 2 * p);
      }
    }
    for (int t = 0; t < T; ++t) {
      const ActPair& ap = acts[t][p];
      __m512i xq = _mm512_load_si512(ap.qs);
      const __m512i bias = _mm512_load_si512(ap.bias);
      __m512 xs = _mm512_load_ps(ap.scale);
      KeepInRegister(xq);
      KeepInRegister(xs);
      for (int i = 0; i < R; ++i) {
        __m512i dot = _mm512_dpbusd_epi32(bias, wc[i], xq);
        acc[i][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(ws[i], xs), acc[i][t]);
      }
    }
  };
  const int64_t n_blocks = w.cols / 32;
  for (int64_t p = 0; p < n_blocks / 2; ++p) step(p, std::false_type{});
  if (n_blocks & 1) step(n_blocks / 2, std::true_type{});

  for (int t = 0; t < T; ++t)
    for (int i = 0; i < R; ++i)
      out[(t0 + t) * out_stride + r0 + i] = _mm512_reduce_add_ps(acc[i][t]);
}

using TileFn = void (*)(const MatrixView&, int64_t, const QuantizedActs&, int64_t, float*, int64_t);

template <class F>
TileFn PickTile(int64_t nr, int64_t nt) {
  static_assert(kTileRows == 4 && kTileTokens == 4);
  return PickTileShape<TileFn>(nr, nt, [](auto rows, auto tokens) -> TileFn {
    return Tile<F, decltype(rows)::value, decltype(tokens)::value>;
  });
}

template <class F>
void Rows(const MatrixView& w, int64_t r0, int64_t r1, const QuantizedActs& a, int64_t t0,
          int64_t t1, float* out, int64_t out_stride) {
  for (int64_t t = t0; t < t1; t += kTileTokens) {
    const int64_t nt = std::min<int64_t>(kTileTokens, t1 - t);
    int64_t r = r0;
    if (nt == 1) {
      for (; r + kDecodeTileRows <= r1; r += kDecodeTileRows) {
        Tile<F, kDecodeTileRows, 1>(w, r, a, t, out, out_stride);
      }
    }
    for (; r < r1; r += kTileRows) {
      const int64_t nr = std::min<int64_t>(kTileRows, r1 - r);
      PickTile<F>(nr, nt)(w, r, a, t, out, out_stride);
    }
  }
}

#else  // portable fallback: the same integer arithmetic, one (row, token) at a time

struct Q8_0Format {
  using Block = BlockQ8_0;
  static int Value(const Block& b, int j) { return b.qs[j]; }
};
struct Q4_0Format {
  using Block = BlockQ4_0;
  static int Value(const Block& b, int j) {
    return (j < 16 ? (b.qs[j] & 0x0f) : (b.qs[j - 16] >> 4)) - 8;
  }
};

struct Q5_0Format {
  using Block = BlockQ5_0;
  static int Value(const Block& b, int j) {
    uint32_t qh;
    std::memcpy(&qh, b.qh, 4);
    const int low = j < 16 ? (b.qs[j] & 0x0f) : (b.qs[j - 16] >> 4);
    return (low | (((qh >> j) & 1) << 4)) - 16;
  }
};

template <class F>
void Rows(const MatrixView& w, int64_t r0, int64_t r1, const QuantizedActs& a, int64_t t0,
          int64_t t1, float* out, int64_t out_stride) {
  const int64_t n_blocks = w.cols / 32;
  for (int64_t r = r0; r < r1; ++r) {
    const auto* blocks = reinterpret_cast<const typename F::Block*>(w.row(r));
    for (int64_t t = t0; t < t1; ++t) {
      const ActPair* acts = a.token(t);
      float acc = 0.0f;
      for (int64_t b = 0; b < n_blocks; ++b) {
        const ActPair& ap = acts[b / 2];
        const int half = static_cast<int>(b & 1);
        int32_t dot = 0;
        for (int j = 0; j < 32; ++j) dot += F::Value(blocks[b], j) * ap.qs[32 * half + j];
        acc += static_cast<float>(dot) * (F16ToF32(blocks[b].d) * ap.scale[8 * half]);
      }
      out[t * out_stride + r] = acc;
    }
  }
}

#endif

}  // namespace

void MatMulRowsQ8_0(const MatrixView& w, int64_t r0, int64_t r1, const QuantizedActs& a, int64_t t0,
                    int64_t t1, float* out, int64_t out_stride) {
  Rows<Q8_0Format>(w, r0, r1, a, t0, t1, out, out_stride);
}

void MatMulRowsQ4_0(const MatrixView& w, int64_t r0, int64_t r1, const QuantizedActs& a, int64_t t0,
                    int64_t t1, float* out, int64_t out_stride) {
  Rows<Q4_0Format>(w, r0, r1, a, t0, t1, out, out_stride);
}

void MatMulRowsQ5_0(const MatrixView& w, int64_t r0, int64_t r1, const QuantizedActs& a, int64_t t0,
                    int64_t t1, float* out, int64_t out_stride) {
  Rows<Q5_0Format>(w, r0, r1, a, t0, t1, out, out_stride);
}

}  // namespace kvs::matmul_internal::KVS_ISA

#include "kernels/isa_end.h"
