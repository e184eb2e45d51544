// F32, F16 and BF16 weights in WeightLayout::kInterleaved16 (kernels/repack.h) times f32
// activations. One weight vector is one column of 16 rows; each token's activation for that
// column is broadcast and FMA'd into a (16 rows, token) accumulator, so a tile does a single
// widening per 16 rows and column and no horizontal sums at all.
#include <algorithm>

#include "core/check.h"
#include "kernels/matmul_internal.h"
#include "kernels/repack.h"
#include "tensor/dtype.h"

#include "kernels/isa_begin.h"
#include "kernels/simd.h"

#if defined(KVS_ISA_AVX512)
#define KVS_MATMUL_AVX512 1
#endif

namespace kvs::matmul_internal::KVS_ISA {

#if KVS_MATMUL_AVX512

namespace {

// Columns summed in one accumulator before it is added to the output: 16 rows x tokens each
// run one sequential FMA chain, and restarting it keeps its rounding error at that of a
// 256-term sum whatever the row length.
constexpr int64_t kChunkCols = 256;
// Decode prefetch distance within each group's stream (bytes).
constexpr size_t kPrefetchBytes = 2048;

struct F32Column {
  static constexpr size_t kBytes = 4 * kInterleaveRows;
  static __m512 Load(const uint8_t* p) { return _mm512_loadu_ps(p); }
};
struct F16Column {
  static constexpr size_t kBytes = 2 * kInterleaveRows;
  static __m512 Load(const uint8_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
};
struct BF16Column {
  static constexpr size_t kBytes = 2 * kInterleaveRows;
  static __m512 Load(const uint8_t* p) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
};

constexpr int kDecodeGroups = 4;

template <class F, int G, int T>
void Tile(const MatrixView& w, int64_t g0, const float* x, int64_t t0, float* out,
          int64_t out_stride) {
  const size_t group_bytes = kInterleaveRows * w.row_bytes;
  const uint8_t* groups[G];
  for (int g = 0; g < G; ++g) groups[g] = w.data + (g0 + g) * group_bytes;
  const float* xs[T];
  for (int t = 0; t < T; ++t) xs[t] = x + (t0 + t) * w.cols;
  float* outs[T];
  for (int t = 0; t < T; ++t) outs[t] = out + (t0 + t) * out_stride + g0 * kInterleaveRows;

  for (int64_t c0 = 0; c0 < w.cols; c0 += kChunkCols) {
    const int64_t c1 = std::min(w.cols, c0 + kChunkCols);
    __m512 acc[G][T];
    for (int g = 0; g < G; ++g)
      for (int t = 0; t < T; ++t) acc[g][t] = _mm512_setzero_ps();
    for (int64_t c = c0; c < c1; ++c) {
      __m512 wv[G];
      for (int g = 0; g < G; ++g) {
        const uint8_t* p = groups[g] + c * F::kBytes;
        if constexpr (G == kDecodeGroups) {
          if (c % (64 / F::kBytes) == 0) {
            _mm_prefetch(reinterpret_cast<const char*>(p) + kPrefetchBytes, _MM_HINT_T0);
          }
        }
        wv[g] = F::Load(p);
      }
      for (int t = 0; t < T; ++t) {
        const __m512 xv = _mm512_set1_ps(xs[t][c]);
        for (int g = 0; g < G; ++g) acc[g][t] = _mm512_fmadd_ps(wv[g], xv, acc[g][t]);
      }
    }
    for (int t = 0; t < T; ++t) {
      for (int g = 0; g < G; ++g) {
        float* o = outs[t] + g * kInterleaveRows;
        if (c0 > 0) acc[g][t] = _mm512_add_ps(acc[g][t], _mm512_loadu_ps(o));
        _mm512_storeu_ps(o, acc[g][t]);
      }
    }
  }
}

using TileFn = void (*)(const MatrixView&, int64_t, const float*, int64_t, float*, int64_t);

// Prefill: 2 groups x 8 tokens, 16 accumulators; each widened column serves 8 FMAs.
constexpr int kPrefillGroups = 2;
constexpr int kPrefillTokens = 8;
// A few tokens (a speculative verification: the last token and its drafts) are memory-bound
// like a decode: 4 groups x up to 6 tokens (24 accumulators) keep 8+ FMA chains in flight and
// prefetch four weight streams, so that 5 tokens cost about what one does. With 2 groups they
// cost 1.7-2x a decode (F16 llama-1b: pp4 63 t/s against pp1 27 t/s).
constexpr int kFewTokens = static_cast<int>(kFloatFewTokens);

template <class F, int G>
TileFn PickTokens(int64_t nt) {
  return PickTokenCount<TileFn, kPrefillTokens>(
      nt, [](auto tokens) -> TileFn { return Tile<F, G, decltype(tokens)::value>; });
}

template <class F>
void Rows(const MatrixView& w, int64_t r0, int64_t r1, const float* x, int64_t t0, int64_t t1,
          float* out, int64_t out_stride) {
  const int64_t g_begin = r0 / kInterleaveRows, g_end = r1 / kInterleaveRows;
  if (t1 - t0 == 1) {
    int64_t g = g_begin;
    for (; g + kDecodeGroups <= g_end; g += kDecodeGroups) {
      Tile<F, kDecodeGroups, 1>(w, g, x, t0, out, out_stride);
    }
    for (; g < g_end; ++g) Tile<F, 1, 1>(w, g, x, t0, out, out_stride);
    return;
  }
  if (t1 - t0 <= kFewTokens) {
    const TileFn few = PickTokenCount<TileFn, kFewTokens>(t1 - t0, [](auto tokens) -> TileFn {
      return Tile<F, kDecodeGroups, decltype(tokens)::value>;
    });
    int64_t g = g_begin;
    for (; g + kDecodeGroups <= g_end; g += kDecodeGroups) few(w, g, x, t0, out, out_stride);
    for (; g < g_end; ++g) PickTokens<F, 1>(t1 - t0)(w, g, x, t0, out, out_stride);
    return;
  }
  for (int64_t t = t0; t < t1; t += kPrefillTokens) {
    const int64_t nt = std::min<int64_t>(kPrefillTokens, t1 - t);
    const TileFn full = PickTokens<F, kPrefillGroups>(nt);
    int64_t g = g_begin;
    for (; g + kPrefillGroups <= g_end; g += kPrefillGroups) full(w, g, x, t, out, out_stride);
    for (; g < g_end; ++g) PickTokens<F, 1>(nt)(w, g, x, t, out, out_stride);
  }
}

}  // namespace

void MatMulRowsInterleavedFloat(const MatrixView& w, int64_t r0, int64_t r1, const float* x,
                                int64_t t0, int64_t t1, float* out, int64_t out_stride) {
  KVS_CHECK(r0 % kInterleaveRows == 0 && r1 % kInterleaveRows == 0);
  switch (w.type) {
    case DType::kF32:
      return Rows<F32Column>(w, r0, r1, x, t0, t1, out, out_stride);
    case DType::kF16:
      return Rows<F16Column>(w, r0, r1, x, t0, t1, out, out_stride);
    case DType::kBF16:
      return Rows<BF16Column>(w, r0, r1, x, t0, t1, out, out_stride);
    default:
      KVS_CHECK(false && "MatMulRowsInterleavedFloat: not a float type");
  }
}

#elif defined(KVS_ISA_AVX2)

#include "kernels/matmul_float_interleaved_avx2.inc"

#else

void MatMulRowsInterleavedFloat(const MatrixView&, int64_t, int64_t, const float*, int64_t, int64_t,
                                float*, int64_t) {
  KVS_CHECK(false && "interleaved matrices need the AVX-512 or AVX2 kernels");
}

#endif

}  // namespace kvs::matmul_internal::KVS_ISA

#include "kernels/isa_end.h"
