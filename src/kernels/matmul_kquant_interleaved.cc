// Q4_K and Q6_K weights in WeightLayout::kInterleaved16 (group-block layouts in repack.cc) times
// activations quantized per 256 values (KAct256, llama.cpp's Q8_K scheme). With one activation
// scale per super-block, every sub-block scale is an integer: a lane's sub-block dot products
// are multiplied by their 6- or 8-bit scales and summed in int32, and the super-block pays for
// one f32 conversion per 16 rows and token.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"
#include "kernels/matmul_internal.h"
#include "kernels/repack.h"
#include "tensor/kquants.h"

#include "kernels/isa_begin.h"
#include "kernels/simd.h"

#if defined(KVS_ISA_AVX512)
#define KVS_MATMUL_AVX512 1
#endif

namespace kvs::matmul_internal::KVS_ISA {

namespace {

// The scheme in scalar code: builds without AVX-512 (never reached: no kernel uses it there).
[[maybe_unused]] void QuantizeQ8KScalar(const float* x, int64_t cols, KAct256* dst) {
  KVS_CHECK(cols % kSuperBlock == 0);
  for (int64_t b = 0; b < cols / kSuperBlock; ++b) {
    const float* xb = x + b * kSuperBlock;
    KAct256& a = dst[b];
    float amax = 0.0f, max = 0.0f;
    for (int i = 0; i < kSuperBlock; ++i) {
      if (std::fabs(xb[i]) > amax) {
        amax = std::fabs(xb[i]);
        max = xb[i];
      }
    }
    if (amax == 0.0f) {
      std::memset(&a, 0, sizeof(a));
      continue;
    }
    const float iscale = -127.0f / max;
    for (int i = 0; i < kSuperBlock; ++i) {
      // Not finite (NaN or Inf in the block, or -127 / max overflowing): code 0 at every level.
      const float v = iscale * xb[i];
      a.qs[i] = std::isfinite(v)
                    ? static_cast<int8_t>(std::min(127, static_cast<int>(std::nearbyint(v))))
                    : int8_t{0};
    }
    a.d = 1.0f / iscale;
    for (int k = 0; k < 16; ++k) {
      int32_t sum = 0;
      for (int i = 0; i < 16; ++i) sum += a.qs[16 * k + i];
      a.bias16[k] = -32 * sum;
    }
    for (int j = 0; j < 8; ++j)
      a.bsum32[j] = static_cast<float>(-(a.bias16[2 * j] + a.bias16[2 * j + 1]) / 32);
  }
}

}  // namespace

#if KVS_MATMUL_AVX512

namespace {

constexpr size_t kQ4KGroupBlock = kInterleaveRows * sizeof(BlockQ4_K);  // 2304
constexpr size_t kQ6KGroupBlock = kInterleaveRows * sizeof(BlockQ6_K);  // 3360
constexpr size_t kPrefetchBytes = 2048;

using simd::Broadcast4;
using simd::Halves16;

inline __m512i Bytes16(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline void Prefetch(const uint8_t* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes, _MM_HINT_T0);
}

template <int G, int T>
void TileQ4K(const MatrixView& w, int64_t g0, const KActs256& a, int64_t t0, float* out,
             int64_t out_stride) {
  const size_t group_bytes = kInterleaveRows * w.row_bytes;
  const KAct256* acts[T];
  for (int t = 0; t < T; ++t) acts[t] = a.token(t0 + t);
  __m512 acc[G][T];
  for (int g = 0; g < G; ++g)
    for (int t = 0; t < T; ++t) acc[g][t] = _mm512_setzero_ps();
  const __m512i nibble = _mm512_set1_epi8(0x0f);

  for (int64_t sb = 0; sb < w.cols / kSuperBlock; ++sb) {
    const uint8_t* gb[G];
    for (int g = 0; g < G; ++g) gb[g] = w.data + (g0 + g) * group_bytes + sb * kQ4KGroupBlock;
    __m512i total[G][T];
    for (int g = 0; g < G; ++g)
      for (int t = 0; t < T; ++t) total[g][t] = _mm512_setzero_si512();
    // Sub-blocks jj and jj + 4 share their code chunks (low and high nibbles).
    for (int jj = 0; jj < 4; ++jj) {
      __m512i sum_lo[G][T], sum_hi[G][T];
      for (int g = 0; g < G; ++g)
        for (int t = 0; t < T; ++t) sum_lo[g][t] = sum_hi[g][t] = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int s = 0; s < 8; ++s) {
        const int k = 8 * jj + s;
        __m512i lo[G], hi[G];
        for (int g = 0; g < G; ++g) {
          const uint8_t* chunk = gb[g] + 256 + 64 * k;
          if constexpr (T == 1) Prefetch(chunk);
          const __m512i raw = _mm512_loadu_si512(chunk);
          lo[g] = _mm512_and_si512(raw, nibble);
          hi[g] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nibble);
        }
        for (int t = 0; t < T; ++t) {
          const __m512i x_lo = Broadcast4(acts[t][sb].qs + 4 * k);
          const __m512i x_hi = Broadcast4(acts[t][sb].qs + 128 + 4 * k);
          for (int g = 0; g < G; ++g) {
            sum_lo[g][t] = _mm512_dpbusd_epi32(sum_lo[g][t], lo[g], x_lo);
            sum_hi[g][t] = _mm512_dpbusd_epi32(sum_hi[g][t], hi[g], x_hi);
          }
        }
      }
      for (int g = 0; g < G; ++g) {
        const __m512i six = _mm512_set1_epi32(63);
        const __m512i sc_lo = _mm512_and_si512(Bytes16(gb[g] + 64 + 16 * jj), six);
        const __m512i sc_hi = _mm512_and_si512(Bytes16(gb[g] + 64 + 16 * (jj + 4)), six);
        for (int t = 0; t < T; ++t) {
          total[g][t] = _mm512_add_epi32(total[g][t], _mm512_mullo_epi32(sum_lo[g][t], sc_lo));
          total[g][t] = _mm512_add_epi32(total[g][t], _mm512_mullo_epi32(sum_hi[g][t], sc_hi));
        }
      }
    }
    for (int g = 0; g < G; ++g) {
      __m512 mins[8];
      for (int j = 0; j < 8; ++j) {
        const __m512i top =
            _mm512_slli_epi32(_mm512_srli_epi32(Bytes16(gb[g] + 64 + 16 * j), 6), 4);
        const __m512i low =
            _mm512_and_si512(_mm512_srli_epi32(Bytes16(gb[g] + 192 + 16 * (j % 4)), 4 * (j / 4)),
                             _mm512_set1_epi32(0x0f));
        mins[j] = _mm512_cvtepi32_ps(_mm512_or_si512(top, low));
      }
      const __m512 d = Halves16(gb[g]), dmin = Halves16(gb[g] + 32);
      for (int t = 0; t < T; ++t) {
        const KAct256& act = acts[t][sb];
        __m512 msum = _mm512_mul_ps(mins[0], _mm512_set1_ps(act.bsum32[0]));
        for (int j = 1; j < 8; ++j)
          msum = _mm512_fmadd_ps(mins[j], _mm512_set1_ps(act.bsum32[j]), msum);
        const __m512 da = _mm512_set1_ps(act.d);
        acc[g][t] =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(total[g][t]), _mm512_mul_ps(d, da), acc[g][t]);
        acc[g][t] = _mm512_fnmadd_ps(msum, _mm512_mul_ps(dmin, da), acc[g][t]);
      }
    }
  }
  for (int t = 0; t < T; ++t)
    for (int g = 0; g < G; ++g)
      _mm512_storeu_ps(out + (t0 + t) * out_stride + (g0 + g) * kInterleaveRows, acc[g][t]);
}

template <int G, int T>
void TileQ6K(const MatrixView& w, int64_t g0, const KActs256& a, int64_t t0, float* out,
             int64_t out_stride) {
  const size_t group_bytes = kInterleaveRows * w.row_bytes;
  const KAct256* acts[T];
  for (int t = 0; t < T; ++t) acts[t] = a.token(t0 + t);
  __m512 acc[G][T];
  for (int g = 0; g < G; ++g)
    for (int t = 0; t < T; ++t) acc[g][t] = _mm512_setzero_ps();
  const __m512i nibble = _mm512_set1_epi8(0x0f), top = _mm512_set1_epi8(0x30);

  for (int64_t sb = 0; sb < w.cols / kSuperBlock; ++sb) {
    const uint8_t* gb[G];
    for (int g = 0; g < G; ++g) gb[g] = w.data + (g0 + g) * group_bytes + sb * kQ6KGroupBlock;
    __m512i total[G][T];
    for (int g = 0; g < G; ++g)
      for (int t = 0; t < T; ++t) total[g][t] = _mm512_setzero_si512();
    // Round q4 completes sub-blocks q4, 4 + q4, 8 + q4 and 12 + q4 (16 values = 4 steps each).
    for (int q4 = 0; q4 < 4; ++q4) {
      __m512i sum[4][G][T];
      for (int i = 0; i < 4; ++i)
        for (int t = 0; t < T; ++t) {
          const __m512i bias = _mm512_set1_epi32(acts[t][sb].bias16[q4 + 4 * i]);
          for (int g = 0; g < G; ++g) sum[i][g][t] = bias;
        }
#pragma GCC unroll 4
      for (int mm = 0; mm < 4; ++mm) {
        const int m = 4 * q4 + mm;
        __m512i c[4][G];
        for (int g = 0; g < G; ++g) {
          if constexpr (T == 1) {
            Prefetch(gb[g] + 288 + 64 * m);
            Prefetch(gb[g] + 288 + 64 * (16 + m));
            Prefetch(gb[g] + 2336 + 64 * m);
          }
          const __m512i l0 = _mm512_loadu_si512(gb[g] + 288 + 64 * m);
          const __m512i l1 = _mm512_loadu_si512(gb[g] + 288 + 64 * (16 + m));
          const __m512i h = _mm512_loadu_si512(gb[g] + 2336 + 64 * m);
          c[0][g] = _mm512_or_si512(_mm512_and_si512(l0, nibble),
                                    _mm512_and_si512(_mm512_slli_epi16(h, 4), top));
          c[1][g] = _mm512_or_si512(_mm512_and_si512(l1, nibble),
                                    _mm512_and_si512(_mm512_slli_epi16(h, 2), top));
          c[2][g] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l0, 4), nibble),
                                    _mm512_and_si512(h, top));
          c[3][g] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l1, 4), nibble),
                                    _mm512_and_si512(_mm512_srli_epi16(h, 2), top));
        }
        for (int t = 0; t < T; ++t) {
          for (int i = 0; i < 4; ++i) {
            const __m512i x = Broadcast4(acts[t][sb].qs + 4 * (16 * i + m));
            for (int g = 0; g < G; ++g)
              sum[i][g][t] = _mm512_dpbusd_epi32(sum[i][g][t], c[i][g], x);
          }
        }
      }
      for (int i = 0; i < 4; ++i) {
        for (int g = 0; g < G; ++g) {
          const __m512i sc = _mm512_cvtepi8_epi32(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(gb[g] + 32 + 16 * (q4 + 4 * i))));
          for (int t = 0; t < T; ++t) {
            total[g][t] = _mm512_add_epi32(total[g][t], _mm512_mullo_epi32(sum[i][g][t], sc));
          }
        }
      }
    }
    for (int g = 0; g < G; ++g) {
      const __m512 d = Halves16(gb[g]);
      for (int t = 0; t < T; ++t) {
        const __m512 scale = _mm512_mul_ps(d, _mm512_set1_ps(acts[t][sb].d));
        acc[g][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total[g][t]), scale, acc[g][t]);
      }
    }
  }
  for (int t = 0; t < T; ++t)
    for (int g = 0; g < G; ++g)
      _mm512_storeu_ps(out + (t0 + t) * out_stride + (g0 + g) * kInterleaveRows, acc[g][t]);
}

using TileFn = void (*)(const MatrixView&, int64_t, const KActs256&, int64_t, float*, int64_t);

template <bool kQ4K, int G, int T>
constexpr TileFn kTile = kQ4K ? TileQ4K<G, T> : TileQ6K<G, T>;

template <bool kQ4K>
void Rows(const MatrixView& w, int64_t r0, int64_t r1, const KActs256& a, int64_t t0, int64_t t1,
          float* out, int64_t out_stride) {
  const int64_t g_begin = r0 / kInterleaveRows, g_end = r1 / kInterleaveRows;
  if (t1 - t0 == 1) {
    // Decode: four Q4_K groups at a time, two of Q6_K (its 16 sums per group leave no room
    // for more): independent dpbusd chains and memory streams.
    constexpr int kGroups = kQ4K ? 4 : 2;
    int64_t g = g_begin;
    for (; g + kGroups <= g_end; g += kGroups)
      kTile<kQ4K, kGroups, 1>(w, g, a, t0, out, out_stride);
    for (; g < g_end; ++g) kTile<kQ4K, 1, 1>(w, g, a, t0, out, out_stride);
    return;
  }
  constexpr int kTokens = kQ4K ? 4 : 3;
  for (int64_t t = t0; t < t1; t += kTokens) {
    const int64_t nt = std::min<int64_t>(kTokens, t1 - t);
    const TileFn tile = nt == 1   ? kTile<kQ4K, 1, 1>
                        : nt == 2 ? kTile<kQ4K, 1, 2>
                        : nt == 3 ? kTile<kQ4K, 1, 3>
                                  : kTile<kQ4K, 1, kTokens>;
    for (int64_t g = g_begin; g < g_end; ++g) tile(w, g, a, t, out, out_stride);
  }
}

}  // namespace

void QuantizeActivationsQ8K(const float* x, int64_t cols, KAct256* dst) {
  KVS_CHECK(cols % kSuperBlock == 0);
  for (int64_t b = 0; b < cols / kSuperBlock; ++b) {
    const float* xb = x + b * kSuperBlock;
    KAct256& a = dst[b];
    __m512 v[16];
    __m512 amax_v = _mm512_setzero_ps();
    for (int i = 0; i < 16; ++i) {
      v[i] = _mm512_loadu_ps(xb + 16 * i);
      // max_ps gives its second operand where either is NaN: a NaN is skipped, as in the twin.
      amax_v = _mm512_max_ps(_mm512_abs_ps(v[i]), amax_v);
    }
    const float amax = _mm512_reduce_max_ps(amax_v);
    if (amax == 0.0f) {
      std::memset(&a, 0, sizeof(a));
      continue;
    }
    // The first value of that magnitude sets the sign, as in the scalar scheme.
    float max = 0.0f;
    for (int i = 0; i < 16; ++i) {
      const __mmask16 hit =
          _mm512_cmp_ps_mask(_mm512_abs_ps(v[i]), _mm512_set1_ps(amax), _CMP_EQ_OQ);
      if (hit) {
        max = xb[16 * i + __builtin_ctz(hit)];
        break;
      }
    }
    const float iscale = -127.0f / max;
    int32_t sum16[16];
    for (int i = 0; i < 16; ++i) {
      // cvtps rounds half to even under the default rounding mode, like nearbyint; a value that
      // is not finite gets code 0, as in the twin.
      const __m512 scaled = _mm512_mul_ps(v[i], _mm512_set1_ps(iscale));
      const __mmask16 finite =
          _mm512_cmp_ps_mask(_mm512_abs_ps(scaled), _mm512_set1_ps(INFINITY), _CMP_LT_OQ);
      const __m512i q = _mm512_maskz_mov_epi32(
          finite, _mm512_min_epi32(_mm512_cvtps_epi32(scaled), _mm512_set1_epi32(127)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(a.qs + 16 * i), _mm512_cvtepi32_epi8(q));
      sum16[i] = _mm512_reduce_add_epi32(q);
    }
    a.d = 1.0f / iscale;
    for (int k = 0; k < 16; ++k) a.bias16[k] = -32 * sum16[k];
    for (int j = 0; j < 8; ++j) a.bsum32[j] = static_cast<float>(sum16[2 * j] + sum16[2 * j + 1]);
  }
}

void MatMulRowsInterleavedKQuant(const MatrixView& w, int64_t r0, int64_t r1, const KActs256& a,
                                 int64_t t0, int64_t t1, float* out, int64_t out_stride) {
  KVS_CHECK(r0 % kInterleaveRows == 0 && r1 % kInterleaveRows == 0);
  if (w.type == DType::kQ4_K) return Rows<true>(w, r0, r1, a, t0, t1, out, out_stride);
  KVS_CHECK(w.type == DType::kQ6_K);
  Rows<false>(w, r0, r1, a, t0, t1, out, out_stride);
}

#elif defined(KVS_ISA_AVX2)

#include "kernels/matmul_kquant_interleaved_avx2.inc"

#else

void QuantizeActivationsQ8K(const float* x, int64_t cols, KAct256* dst) {
  QuantizeQ8KScalar(x, cols, dst);
}

void MatMulRowsInterleavedKQuant(const MatrixView&, int64_t, int64_t, const KActs256&, int64_t,
                                 int64_t, float*, int64_t) {
  KVS_CHECK(false && "interleaved matrices need the AVX-512 or AVX2 kernels");
}

#endif

}  // namespace kvs::matmul_internal::KVS_ISA

#include "kernels/isa_end.h"
