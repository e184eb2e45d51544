#include "kernels/matmul.h"

#include <algorithm>
#include <vector>

#include "core/aligned.h"
#include "core/check.h"
#include "kernels/matmul_internal.h"
#include "kernels/ops.h"
#include "kernels/repack.h"
#include "tensor/kquants.h"
#include "tensor/quantize.h"

namespace kvs {
namespace {

using matmul_internal::ActPair;

// Thread boundaries fall on multiples of 16 rows so that, per token, no two threads write the
// same 64-byte line of `out`.
constexpr size_t kRowGrain = 16;

// During prefill a thread walks its rows in blocks whose weights fit in L2, and runs every
// token through a block before moving on: each weight byte then comes from memory once per
// call instead of once per token tile.
constexpr size_t kBlockBytes = 256 * 1024;
// Blocks are whole prefill tiles of the interleaved kernels (two groups of 16 rows).
constexpr int64_t kBlockRowMultiple = 32;

// Scratch for quantized activations, kept per calling thread so that decode, which calls
// MatMul several times per layer, does not allocate.
template <class T>
T* ActScratch(size_t n) {
  thread_local AlignedPtr<T> buffer;
  thread_local size_t capacity = 0;
  if (n > capacity) {
    buffer = AllocateAligned<T>(n);
    capacity = n;
  }
  return buffer.get();
}

// Quantizes each token's activations with quantize(t), on the pool when that pays.
template <class Fn>
void QuantizeTokens(int64_t n_tokens, ThreadPool& pool, const Fn& quantize) {
  auto range = [&](int, size_t begin, size_t end) {
    for (size_t t = begin; t < end; ++t) quantize(static_cast<int64_t>(t));
  };
  // One token quantizes in well under a microsecond per 4k values; waking the pool for it
  // would cost more than it saves.
  if (n_tokens >= 8) {
    pool.ParallelFor(static_cast<size_t>(n_tokens), 1, range);
  } else {
    range(0, 0, static_cast<size_t>(n_tokens));
  }
}

// Runs kernel(r0, r1, t0, t1) over all rows and tokens, rows split over the pool.
template <class Kernel>
void ForRowBlocks(const MatrixView& w, int64_t n_tokens, ThreadPool& pool, const Kernel& kernel,
                  int64_t one_pass_tokens = 1) {
  // Tokens that the kernel's tile takes in one pass (one token; a speculative verification's
  // few for the float kernels) read each weight once whatever the order: no blocking, which
  // would only cut the kernels' multi-row tiles short at every block edge.
  const int64_t block_rows =
      n_tokens <= one_pass_tokens
          ? w.rows
          : std::max<int64_t>(kBlockRowMultiple,
                              static_cast<int64_t>(kBlockBytes / std::max<size_t>(1, w.row_bytes)) /
                                  kBlockRowMultiple * kBlockRowMultiple);
  pool.ParallelFor(static_cast<size_t>(w.rows), kRowGrain, [&](int, size_t begin, size_t end) {
    for (int64_t r = static_cast<int64_t>(begin); r < static_cast<int64_t>(end); r += block_rows) {
      kernel(r, std::min<int64_t>(r + block_rows, static_cast<int64_t>(end)), 0, n_tokens);
    }
  });
}

void MatMulRowsDequantized(const MatrixView& w, int64_t r0, int64_t r1, const float* x, int64_t t0,
                           int64_t t1, float* out) {
  thread_local std::vector<float> row;
  row.resize(static_cast<size_t>(w.cols));
  for (int64_t r = r0; r < r1; ++r) {
    DequantizeRow(w.type, w.row(r), row.data(), w.cols);
    for (int64_t t = t0; t < t1; ++t)
      out[t * w.rows + r] = DotF32(row.data(), x + t * w.cols, w.cols);
  }
}

}  // namespace

void MatMul(const MatrixView& w, const float* x, int64_t n_tokens, float* out, ThreadPool& pool) {
  if (w.rows == 0 || n_tokens == 0) return;
  KVS_CHECK(w.row_bytes >= RowBytes(w.type, static_cast<size_t>(w.cols)));
  if (w.layout == WeightLayout::kInterleaved16 &&
      (w.type == DType::kF32 || w.type == DType::kF16 || w.type == DType::kBF16)) {
    ForRowBlocks(
        w, n_tokens, pool,
        [&](int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
          matmul_internal::MatMulRowsInterleavedFloat(w, r0, r1, x, t0, t1, out, w.rows);
        },
        matmul_internal::kFloatFewTokens);
    return;
  }
  if (w.layout == WeightLayout::kInterleaved16 &&
      (w.type == DType::kQ4_K || w.type == DType::kQ6_K)) {
    const int64_t n_blocks = w.cols / kSuperBlock;
    auto* acts = ActScratch<matmul_internal::KAct256>(static_cast<size_t>(n_tokens * n_blocks));
    QuantizeTokens(n_tokens, pool, [&](int64_t t) {
      matmul_internal::QuantizeActivationsQ8K(x + t * w.cols, w.cols, acts + t * n_blocks);
    });
    const matmul_internal::KActs256 a{acts, n_blocks};
    ForRowBlocks(w, n_tokens, pool, [&](int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
      matmul_internal::MatMulRowsInterleavedKQuant(w, r0, r1, a, t0, t1, out, w.rows);
    });
    return;
  }
  if (w.layout == WeightLayout::kInterleaved16) {
    const int64_t n_blocks = w.cols / 32;
    auto* acts = ActScratch<matmul_internal::ActBlock>(static_cast<size_t>(n_tokens * n_blocks));
    const int32_t code_offset = matmul_internal::InterleavedCodeOffset(w.type);
    QuantizeTokens(n_tokens, pool, [&](int64_t t) {
      matmul_internal::QuantizeActivationsFlat(x + t * w.cols, w.cols, code_offset,
                                               acts + t * n_blocks);
    });
    const matmul_internal::FlatActs a{acts, n_blocks};
    ForRowBlocks(w, n_tokens, pool, [&](int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
      matmul_internal::MatMulRowsInterleaved(w, r0, r1, a, t0, t1, out, w.rows);
    });
    return;
  }
  switch (w.type) {
    case DType::kQ8_0:
    case DType::kQ4_0:
    case DType::kQ5_0: {
      KVS_CHECK(w.cols % 32 == 0);
      const int32_t code_offset = w.type == DType::kQ8_0   ? matmul_internal::kCodeOffsetQ8_0
                                  : w.type == DType::kQ4_0 ? matmul_internal::kCodeOffsetQ4_0
                                                           : matmul_internal::kCodeOffsetQ5_0;
      const int64_t n_pairs = (w.cols / 32 + 1) / 2;
      ActPair* acts = ActScratch<ActPair>(static_cast<size_t>(n_tokens * n_pairs));
      QuantizeTokens(n_tokens, pool, [&](int64_t t) {
        matmul_internal::QuantizeActivations(x + t * w.cols, w.cols, code_offset,
                                             acts + t * n_pairs);
      });
      const matmul_internal::QuantizedActs a{acts, n_pairs};
      auto* rows_fn = w.type == DType::kQ8_0   ? matmul_internal::MatMulRowsQ8_0
                      : w.type == DType::kQ4_0 ? matmul_internal::MatMulRowsQ4_0
                                               : matmul_internal::MatMulRowsQ5_0;
      ForRowBlocks(w, n_tokens, pool, [&](int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
        rows_fn(w, r0, r1, a, t0, t1, out, w.rows);
      });
      return;
    }
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
      ForRowBlocks(w, n_tokens, pool, [&](int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
        matmul_internal::MatMulRowsFloat(w, r0, r1, x, t0, t1, out, w.rows);
      });
      return;
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      if (matmul_internal::KQuantKernelAvailable(w.type)) {
        KVS_CHECK(w.cols % kSuperBlock == 0);
        const int64_t n_blocks = w.cols / kSuperBlock;
        auto* acts =
            ActScratch<matmul_internal::KActBlock>(static_cast<size_t>(n_tokens * n_blocks));
        const matmul_internal::KActOrder order = matmul_internal::KActOrderFor(w.type);
        QuantizeTokens(n_tokens, pool, [&](int64_t t) {
          matmul_internal::QuantizeActivationsK(x + t * w.cols, w.cols, order, acts + t * n_blocks);
        });
        const matmul_internal::KQuantizedActs a{acts, n_blocks};
        ForRowBlocks(w, n_tokens, pool, [&](int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
          matmul_internal::MatMulRowsKQuant(w, r0, r1, a, t0, t1, out, w.rows);
        });
        return;
      }
      [[fallthrough]];
    default:
      // Formats without an integer kernel (Q2_K, Q3_K, Q4_1, Q5_1; K-quants without AVX-512):
      // dequantize each row once and reuse it for every token.
      ForRowBlocks(w, n_tokens, pool, [&](int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
        MatMulRowsDequantized(w, r0, r1, x, t0, t1, out);
      });
      return;
  }
}

void MatMulReference(const MatrixView& w, const float* x, int64_t n_tokens, float* out) {
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    ReadRow(w, r, row.data());
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float* xt = x + t * w.cols;
      double sum = 0.0;
      for (int64_t c = 0; c < w.cols; ++c) sum += static_cast<double>(row[c]) * xt[c];
      out[t * w.rows + r] = static_cast<float>(sum);
    }
  }
}

}  // namespace kvs
