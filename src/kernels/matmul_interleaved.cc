// Q4_0, Q8_0 (and at the AVX2 level Q5_0) weights in WeightLayout::kInterleaved16 (see
// kernels/repack.h) times activations quantized to Q8_0. Each 32-bit lane of an accumulator is one
// (row, token) pair: a block's eight dpbusd steps add into it with no reduction between them, and
// only then does the block pay for its f32 conversion and scaling — once per 16 rows, where the
// row-major kernels pay per row and per pair of blocks.
#include <algorithm>
#include <cstring>

#include "core/check.h"
#include "kernels/matmul_internal.h"
#include "kernels/repack.h"
#include "tensor/dtype.h"
#include "tensor/kquants.h"

#include "kernels/isa_begin.h"
#include "kernels/simd.h"

#if defined(KVS_ISA_AVX512)
#define KVS_MATMUL_AVX512 1
#endif

namespace kvs::matmul_internal::KVS_ISA {

bool InterleavedKernelAvailable(DType t) {
  switch (t) {
#if defined(KVS_ISA_AVX2) && !KVS_MATMUL_AVX512
    case DType::kQ5_K:  // AVX2 only: the AVX-512 level keeps its row-major Q5_K and Q5_0
    case DType::kQ5_0:  // kernels
#endif
#if KVS_MATMUL_AVX512 || defined(KVS_ISA_AVX2)
    case DType::kQ4_K:
    case DType::kQ6_K:
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kQ4_0:
    case DType::kQ8_0:
      return true;
#endif
    default:
      return false;
  }
}

#if KVS_MATMUL_AVX512 || defined(KVS_ISA_AVX2)

namespace {

constexpr size_t kScaleBytes = 2 * kInterleaveRows;

// Decode prefetches each group's stream this far ahead; the hardware prefetcher alone left
// decode short of the bandwidth (see matmul_quant.cc).
constexpr size_t kPrefetchBytes = 2048;

#if KVS_MATMUL_AVX512

// A group-block's codes as four pairs of dpbusd operands: pair k covers the activations at
// Offset0(k) and Offset1(k).
struct Q4_0Groups {
  static constexpr size_t kGroupBlockBytes = kInterleaveRows * sizeof(BlockQ4_0);
  static constexpr int Offset0(int k) { return 4 * k; }
  static constexpr int Offset1(int k) { return 16 + 4 * k; }
  static void Load(const uint8_t* codes, int k, __m512i& c0, __m512i& c1) {
    const __m512i raw = _mm512_loadu_si512(codes + 64 * k);
    const __m512i low = _mm512_set1_epi8(0x0f);
    c0 = _mm512_and_si512(raw, low);
    c1 = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
  }
};

struct Q8_0Groups {
  static constexpr size_t kGroupBlockBytes = kInterleaveRows * sizeof(BlockQ8_0);
  static constexpr int Offset0(int k) { return 8 * k; }
  static constexpr int Offset1(int k) { return 8 * k + 4; }
  static void Load(const uint8_t* codes, int k, __m512i& c0, __m512i& c1) {
    c0 = _mm512_loadu_si512(codes + 128 * k);
    c1 = _mm512_loadu_si512(codes + 128 * k + 64);
  }
};

using simd::Broadcast4;

// G groups of 16 rows times T tokens; out rows [16 * g0, 16 * (g0 + G)).
// kPrefetchNext: also fetch the next G groups' weights into L2, a group-block per step, spread
// over the work (the first token tile of a group-major pass, Rows).
template <class F, int G, int T, bool kPrefetchNext = false>
void Tile(const MatrixView& w, int64_t g0, const FlatActs& a, int64_t t0, float* out,
          int64_t out_stride) {
  const size_t group_bytes = kInterleaveRows * w.row_bytes;
  const uint8_t* groups[G];
  for (int g = 0; g < G; ++g) groups[g] = w.data + (g0 + g) * group_bytes;
  const ActBlock* acts[T];
  for (int t = 0; t < T; ++t) acts[t] = a.token(t0 + t);
  __m512 acc[G][T];
  for (int g = 0; g < G; ++g)
    for (int t = 0; t < T; ++t) acc[g][t] = _mm512_setzero_ps();

  const int64_t n_blocks = w.cols / 32;
  for (int64_t b = 0; b < n_blocks; ++b) {
    const size_t offset = b * F::kGroupBlockBytes;
    if constexpr (T == 1) {
      for (int g = 0; g < G; ++g) {
        for (size_t line = 0; line < F::kGroupBlockBytes; line += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(groups[g] + offset + kPrefetchBytes + line),
                       _MM_HINT_T0);
        }
      }
    }
    if constexpr (kPrefetchNext) {
      // Prefetches never fault: past the matrix's end they are dropped.
      for (int g = 0; g < G; ++g) {
        for (size_t line = 0; line < F::kGroupBlockBytes; line += 64) {
          _mm_prefetch(reinterpret_cast<const char*>(groups[g] + G * group_bytes + offset + line),
                       _MM_HINT_T1);
        }
      }
    }
    __m512i isum[G][T];
    for (int t = 0; t < T; ++t) {
      const __m512i bias = _mm512_set1_epi32(acts[t][b].bias);
      for (int g = 0; g < G; ++g) isum[g][t] = bias;
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) {
      __m512i c0[G], c1[G];
      for (int g = 0; g < G; ++g) F::Load(groups[g] + offset + kScaleBytes, k, c0[g], c1[g]);
      for (int t = 0; t < T; ++t) {
        const __m512i x0 = Broadcast4(acts[t][b].qs + F::Offset0(k));
        const __m512i x1 = Broadcast4(acts[t][b].qs + F::Offset1(k));
        for (int g = 0; g < G; ++g) {
          isum[g][t] = _mm512_dpbusd_epi32(isum[g][t], c0[g], x0);
          isum[g][t] = _mm512_dpbusd_epi32(isum[g][t], c1[g], x1);
        }
      }
    }
    for (int g = 0; g < G; ++g) {
      const __m512 ws = simd::Halves16(groups[g] + offset);
      for (int t = 0; t < T; ++t) {
        const __m512 scale = _mm512_mul_ps(ws, _mm512_set1_ps(acts[t][b].scale));
        acc[g][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[g][t]), scale, acc[g][t]);
      }
    }
  }
  for (int t = 0; t < T; ++t)
    for (int g = 0; g < G; ++g)
      _mm512_storeu_ps(out + (t0 + t) * out_stride + (g0 + g) * kInterleaveRows, acc[g][t]);
}

#else  // AVX2

#include "kernels/matmul_interleaved_avx2.inc"

#endif

using TileFn = void (*)(const MatrixView&, int64_t, const FlatActs&, int64_t, float*, int64_t);

// Prefill tiles: 2 groups (32 rows) x 4 tokens keeps 8 integer and 8 f32 accumulators, and
// each unpacked code vector serves 4 tokens.
#if KVS_MATMUL_AVX512
constexpr int kPrefillGroups = 2;
#else  // AVX2: one group at a time keeps a tile's int16 sums and codes within 16 registers
constexpr int kPrefillGroups = 1;
#endif
constexpr int kPrefillTokens = 4;
// Up to this many tokens (8 token tiles) a call runs group-major (Rows). A batched decode step
// of 16 sequences ran 5-27% faster so (BM_MatMulStream at 16 tokens: +25%); at 64 tokens the
// first tile's share is small (1/16) and a 64-sequence step showed no gain, so it stays
// token-major there.
constexpr int64_t kFewTokens = 32;
// Decode streams 4 groups at once: 4 independent dpbusd chains and 4 memory streams.
constexpr int kDecodeGroups = 4;

template <class F, int G, bool kPrefetchNext = false>
TileFn PickTokens(int64_t nt) {
  return PickTokenCount<TileFn, kPrefillTokens>(
      nt, [](auto tokens) -> TileFn { return Tile<F, G, decltype(tokens)::value, kPrefetchNext>; });
}

template <class F>
void Rows(const MatrixView& w, int64_t r0, int64_t r1, const FlatActs& a, int64_t t0, int64_t t1,
          float* out, int64_t out_stride) {
  const int64_t g_begin = r0 / kInterleaveRows, g_end = r1 / kInterleaveRows;
  if (t1 - t0 == 1) {
    int64_t g = g_begin;
    for (; g + kDecodeGroups <= g_end; g += kDecodeGroups) {
      Tile<F, kDecodeGroups, 1>(w, g, a, t0, out, out_stride);
    }
    switch (g_end - g) {
      case 3:
        Tile<F, 3, 1>(w, g, a, t0, out, out_stride);
        break;
      case 2:
        Tile<F, 2, 1>(w, g, a, t0, out, out_stride);
        break;
      case 1:
        Tile<F, 1, 1>(w, g, a, t0, out, out_stride);
        break;
      default:
        break;
    }
    return;
  }
  if (t1 - t0 <= kFewTokens) {
    // Few tokens (a small batched decode step): each pair of groups goes through every token tile
    // while it is in L1, and the next pair is fetched meanwhile, so the weights stream from
    // memory once, evenly, under the compute. Token-major order would read a whole block from
    // memory in its first tile, with little compute to hide it behind.
    const TileFn first = PickTokens<F, kPrefillGroups, /*kPrefetchNext=*/true>(
        std::min<int64_t>(kPrefillTokens, t1 - t0));
    int64_t g = g_begin;
    for (; g + kPrefillGroups <= g_end; g += kPrefillGroups) {
      first(w, g, a, t0, out, out_stride);
      for (int64_t t = t0 + kPrefillTokens; t < t1; t += kPrefillTokens) {
        const int64_t nt = std::min<int64_t>(kPrefillTokens, t1 - t);
        PickTokens<F, kPrefillGroups>(nt)(w, g, a, t, out, out_stride);
      }
    }
    for (int64_t t = t0; g < g_end && t < t1; t += kPrefillTokens) {
      PickTokens<F, 1>(std::min<int64_t>(kPrefillTokens, t1 - t))(w, g, a, t, out, out_stride);
    }
    return;
  }
  for (int64_t t = t0; t < t1; t += kPrefillTokens) {
    const int64_t nt = std::min<int64_t>(kPrefillTokens, t1 - t);
    const TileFn full = PickTokens<F, kPrefillGroups>(nt);
    int64_t g = g_begin;
    for (; g + kPrefillGroups <= g_end; g += kPrefillGroups) full(w, g, a, t, out, out_stride);
    if (g < g_end) PickTokens<F, 1>(nt)(w, g, a, t, out, out_stride);
  }
}

}  // namespace

void MatMulRowsInterleaved(const MatrixView& w, int64_t r0, int64_t r1, const FlatActs& a,
                           int64_t t0, int64_t t1, float* out, int64_t out_stride) {
  KVS_CHECK(r0 % kInterleaveRows == 0 && r1 % kInterleaveRows == 0);

  if (w.type == DType::kQ4_0) {
    Rows<Q4_0Groups>(w, r0, r1, a, t0, t1, out, out_stride);
#if !KVS_MATMUL_AVX512
  } else if (w.type == DType::kQ5_0) {
    Rows<Q5_0Groups>(w, r0, r1, a, t0, t1, out, out_stride);
#endif
  } else {
    KVS_CHECK(w.type == DType::kQ8_0);
    Rows<Q8_0Groups>(w, r0, r1, a, t0, t1, out, out_stride);
  }
}

#else  // no interleaved kernels at this level: matrices keep the file's layout

void MatMulRowsInterleaved(const MatrixView&, int64_t, int64_t, const FlatActs&, int64_t, int64_t,
                           float*, int64_t) {
  KVS_CHECK(false && "interleaved matrices need the AVX-512 or AVX2 kernels");
}

#endif

}  // namespace kvs::matmul_internal::KVS_ISA

#include "kernels/isa_end.h"
