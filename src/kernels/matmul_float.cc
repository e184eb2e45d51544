// F32, F16 and BF16 weights times f32 activations: weights are widened to f32 in registers and
// accumulated with FMA. Activations stay f32: narrowing them would cost accuracy and save
// nothing, since decode is bound by reading the weights.
#include <algorithm>
#include <type_traits>

#include "core/check.h"
#include "kernels/matmul_internal.h"
#include "tensor/dtype.h"

#include "kernels/isa_begin.h"
#include "kernels/simd.h"

#if defined(KVS_ISA_AVX512)
#define KVS_MATMUL_AVX512 1
#endif

namespace kvs::matmul_internal::KVS_ISA {
namespace {

#if KVS_MATMUL_AVX512

// Rows x tokens per register tile: 16 accumulators, each weight vector serves four tokens.
constexpr int kTileRows = 4;
constexpr int kTileTokens = 4;
// A lone token (decode) takes 8 rows at a time, to have more rows streaming from memory at once.
constexpr int kDecodeTileRows = 8;

// 16 weights from column c widened to f32; the masked form reads only the lanes in m (the
// row tail), so it never touches memory past the row.
struct F32Format {
  static __m512 Load(const uint8_t* row, int64_t c, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(row) + c);
  }
  static __m512 Load(const uint8_t* row, int64_t c) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + c);
  }
};

struct F16Format {
  static __m512 Load(const uint8_t* row, int64_t c, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(row) + c));
  }
  static __m512 Load(const uint8_t* row, int64_t c) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(reinterpret_cast<const uint16_t*>(row) + c)));
  }
};

struct BF16Format {
  static __m512 Widen(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static __m512 Load(const uint8_t* row, int64_t c, __mmask16 m) {
    return Widen(_mm256_maskz_loadu_epi16(m, reinterpret_cast<const uint16_t*>(row) + c));
  }
  static __m512 Load(const uint8_t* row, int64_t c) {
    return Widen(_mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(reinterpret_cast<const uint16_t*>(row) + c)));
  }
};

// Left alone, GCC folds a load into each of the FMAs that use it, issuing the same load R or T
// times; loads, not FMAs, then limit the tile.
inline void KeepInRegister(__m512& v) {
  asm("" : "+v"(v));
}

template <class F, int R, int T>
void Tile(const MatrixView& w, int64_t r0, const float* x, int64_t t0, float* out,
          int64_t out_stride) {
  const int64_t cols = w.cols;
  const uint8_t* rows[R];
  for (int i = 0; i < R; ++i) rows[i] = w.row(r0 + i);
  const float* xs[T];
  for (int t = 0; t < T; ++t) xs[t] = x + (t0 + t) * cols;
  __m512 acc[R][T];
  for (int i = 0; i < R; ++i)
    for (int t = 0; t < T; ++t) acc[i][t] = _mm512_setzero_ps();

  auto step = [&](int64_t c, auto tail, __mmask16 m) __attribute__((always_inline)) {
    __m512 wv[R];
    for (int i = 0; i < R; ++i) {
      if constexpr (tail) {
        wv[i] = F::Load(rows[i], c, m);
      } else {
        wv[i] = F::Load(rows[i], c);
      }
      KeepInRegister(wv[i]);
    }
    for (int t = 0; t < T; ++t) {
      __m512 xv;
      if constexpr (tail) {
        xv = _mm512_maskz_loadu_ps(m, xs[t] + c);
      } else {
        xv = _mm512_loadu_ps(xs[t] + c);
      }
      KeepInRegister(xv);
      for (int i = 0; i < R; ++i) acc[i][t] = _mm512_fmadd_ps(wv[i], xv, acc[i][t]);
    }
  };
  const int64_t full = cols / 16 * 16;
  for (int64_t c = 0; c < full; c += 16) step(c, std::false_type{}, 0xffff);
  if (full < cols) step(full, std::true_type{}, static_cast<__mmask16>((1u << (cols - full)) - 1));

  for (int t = 0; t < T; ++t)
    for (int i = 0; i < R; ++i)
      out[(t0 + t) * out_stride + r0 + i] = _mm512_reduce_add_ps(acc[i][t]);
}

using TileFn = void (*)(const MatrixView&, int64_t, const float*, int64_t, float*, int64_t);

template <class F>
TileFn PickTile(int64_t nr, int64_t nt) {
  static_assert(kTileRows == 4 && kTileTokens == 4);
  return PickTileShape<TileFn>(nr, nt, [](auto rows, auto tokens) -> TileFn {
    return Tile<F, decltype(rows)::value, decltype(tokens)::value>;
  });
}

template <class F>
void Rows(const MatrixView& w, int64_t r0, int64_t r1, const float* x, int64_t t0, int64_t t1,
          float* out, int64_t out_stride) {
  for (int64_t t = t0; t < t1; t += kTileTokens) {
    const int64_t nt = std::min<int64_t>(kTileTokens, t1 - t);
    int64_t r = r0;
    if (nt == 1) {
      for (; r + kDecodeTileRows <= r1; r += kDecodeTileRows) {
        Tile<F, kDecodeTileRows, 1>(w, r, x, t, out, out_stride);
      }
    }
    for (; r < r1; r += kTileRows) {
      const int64_t nr = std::min<int64_t>(kTileRows, r1 - r);
      PickTile<F>(nr, nt)(w, r, x, t, out, out_stride);
    }
  }
}

#else  // portable fallback

struct F32Format {
  static float Get(const uint8_t* row, int64_t c) { return reinterpret_cast<const float*>(row)[c]; }
};
struct F16Format {
  static float Get(const uint8_t* row, int64_t c) {
    return F16ToF32(reinterpret_cast<const uint16_t*>(row)[c]);
  }
};
struct BF16Format {
  static float Get(const uint8_t* row, int64_t c) {
    return BF16ToF32(reinterpret_cast<const uint16_t*>(row)[c]);
  }
};

template <class F>
void Rows(const MatrixView& w, int64_t r0, int64_t r1, const float* x, int64_t t0, int64_t t1,
          float* out, int64_t out_stride) {
  // Eight partial sums give the compiler independent chains to vectorize or pipeline.
  constexpr int kLanes = 8;
  const int64_t cols = w.cols;
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* row = w.row(r);
    for (int64_t t = t0; t < t1; ++t) {
      const float* xt = x + t * cols;
      float part[kLanes] = {};
      for (int64_t c = 0; c < cols; ++c) part[c % kLanes] += F::Get(row, c) * xt[c];
      float sum = 0.0f;
      for (float p : part) sum += p;
      out[t * out_stride + r] = sum;
    }
  }
}

#endif

}  // namespace

void MatMulRowsFloat(const MatrixView& w, int64_t r0, int64_t r1, const float* x, int64_t t0,
                     int64_t t1, float* out, int64_t out_stride) {
  switch (w.type) {
    case DType::kF32:
      return Rows<F32Format>(w, r0, r1, x, t0, t1, out, out_stride);
    case DType::kF16:
      return Rows<F16Format>(w, r0, r1, x, t0, t1, out, out_stride);
    case DType::kBF16:
      return Rows<BF16Format>(w, r0, r1, x, t0, t1, out, out_stride);
    default:
      KVS_CHECK(false && "MatMulRowsFloat: not a float type");
  }
}

}  // namespace kvs::matmul_internal::KVS_ISA

#include "kernels/isa_end.h"
