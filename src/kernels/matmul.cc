#include "kernels/matmul.h"

#include <algorithm>
#include <span>
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

// Rows a thread runs every token through before moving on (whole prefill tiles, weights
// within kBlockBytes); all rows when the kernel's tile takes every token in one pass.
int64_t BlockRows(const MatrixView& w, int64_t n_tokens, int64_t one_pass_tokens) {
  // Tokens that the kernel's tile takes in one pass (one token; a speculative verification's
  // few for the float kernels) read each weight once whatever the order: no blocking, which
  // would only cut the kernels' multi-row tiles short at every block edge.
  if (n_tokens <= one_pass_tokens) return w.rows;
  return std::max<int64_t>(kBlockRowMultiple,
                           static_cast<int64_t>(kBlockBytes / std::max<size_t>(1, w.row_bytes)) /
                               kBlockRowMultiple * kBlockRowMultiple);
}

// Runs kernel(product, r0, r1, t0, t1) over all rows of all products and all tokens: the
// products' rows are laid end to end and split over the pool in one pass. Each product's rows
// are a multiple of kRowGrain where there is more than one, so thread boundaries stay on
// 16-row groups of every matrix.
template <class Kernel>
void ForRowBlocks(std::span<const MatMulOutput> products, int64_t n_tokens, ThreadPool& pool,
                  const Kernel& kernel, int64_t one_pass_tokens = 1) {
  int64_t total_rows = 0;
  for (const MatMulOutput& p : products) total_rows += p.w->rows;
  pool.ParallelFor(static_cast<size_t>(total_rows), kRowGrain, [&](int, size_t begin, size_t end) {
    int64_t offset = 0;  // first row of product p in the concatenation
    for (const MatMulOutput& p : products) {
      const int64_t r_begin = std::max<int64_t>(static_cast<int64_t>(begin) - offset, 0);
      const int64_t r_end = std::min<int64_t>(static_cast<int64_t>(end) - offset, p.w->rows);
      offset += p.w->rows;
      if (r_begin >= r_end) continue;
      const int64_t block_rows = BlockRows(*p.w, n_tokens, one_pass_tokens);
      for (int64_t r = r_begin; r < r_end; r += block_rows) {
        kernel(p, r, std::min<int64_t>(r + block_rows, r_end), 0, n_tokens);
      }
    }
  });
}

template <class Kernel>
void ForRowBlocks(const MatrixView& w, float* out, int64_t n_tokens, ThreadPool& pool,
                  const Kernel& kernel, int64_t one_pass_tokens = 1) {
  const MatMulOutput one{&w, out};
  ForRowBlocks(
      std::span<const MatMulOutput>(&one, 1), n_tokens, pool,
      [&](const MatMulOutput&, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
        kernel(r0, r1, t0, t1);
      },
      one_pass_tokens);
}

// The activations an interleaved matrix's kernel reads: matrices with equal forms can share
// one quantization of their input.
struct InterleavedActs {
  enum Kind { kNone, kFloat, kFlat, kQ8K } kind = kNone;
  int32_t code_offset = 0;  // kFlat
  bool operator==(const InterleavedActs&) const = default;
};

InterleavedActs ActsOf(const MatrixView& w) {
  if (w.layout != WeightLayout::kInterleaved16) return {};
  switch (w.type) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
      return {InterleavedActs::kFloat};
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      return {InterleavedActs::kQ8K};
    default:
      return {InterleavedActs::kFlat, matmul_internal::InterleavedCodeOffset(w.type)};
  }
}

// Products of interleaved matrices that all take the activations `form`.
void MatMulInterleaved(std::span<const MatMulOutput> products, InterleavedActs form, const float* x,
                       int64_t n_tokens, ThreadPool& pool) {
  const int64_t cols = products[0].w->cols;
  switch (form.kind) {
    case InterleavedActs::kFloat:
      ForRowBlocks(
          products, n_tokens, pool,
          [&](const MatMulOutput& p, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
            matmul_internal::MatMulRowsInterleavedFloat(*p.w, r0, r1, x, t0, t1, p.out, p.w->rows);
          },
          matmul_internal::kFloatFewTokens);
      return;
    case InterleavedActs::kQ8K: {
      const int64_t n_blocks = cols / kSuperBlock;
      auto* acts = ActScratch<matmul_internal::KAct256>(static_cast<size_t>(n_tokens * n_blocks));
      QuantizeTokens(n_tokens, pool, [&](int64_t t) {
        matmul_internal::QuantizeActivationsQ8K(x + t * cols, cols, acts + t * n_blocks);
      });
      const matmul_internal::KActs256 a{acts, n_blocks};
      ForRowBlocks(products, n_tokens, pool,
                   [&](const MatMulOutput& p, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
                     matmul_internal::MatMulRowsInterleavedKQuant(*p.w, r0, r1, a, t0, t1, p.out,
                                                                  p.w->rows);
                   });
      return;
    }
    case InterleavedActs::kFlat: {
      const int64_t n_blocks = cols / 32;
      auto* acts = ActScratch<matmul_internal::ActBlock>(static_cast<size_t>(n_tokens * n_blocks));
      QuantizeTokens(n_tokens, pool, [&](int64_t t) {
        matmul_internal::QuantizeActivationsFlat(x + t * cols, cols, form.code_offset,
                                                 acts + t * n_blocks);
      });
      const matmul_internal::FlatActs a{acts, n_blocks};
      ForRowBlocks(products, n_tokens, pool,
                   [&](const MatMulOutput& p, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
                     matmul_internal::MatMulRowsInterleaved(*p.w, r0, r1, a, t0, t1, p.out,
                                                            p.w->rows);
                   });
      return;
    }
    case InterleavedActs::kNone:
      break;
  }
  KVS_CHECK(false && "not an interleaved matrix");
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
  if (w.layout == WeightLayout::kInterleaved16) {
    const MatMulOutput one{&w, out};
    MatMulInterleaved(std::span<const MatMulOutput>(&one, 1), ActsOf(w), x, n_tokens, pool);
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
      ForRowBlocks(w, out, n_tokens, pool, [&](int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
        rows_fn(w, r0, r1, a, t0, t1, out, w.rows);
      });
      return;
    }
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
      ForRowBlocks(w, out, n_tokens, pool, [&](int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
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
        ForRowBlocks(w, out, n_tokens, pool, [&](int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
          matmul_internal::MatMulRowsKQuant(w, r0, r1, a, t0, t1, out, w.rows);
        });
        return;
      }
      [[fallthrough]];
    default:
      // Formats without an integer kernel at the level in force (Q2_K, Q3_K, Q4_1, Q5_1; at the
      // scalar level the K-quants; at AVX2 the Q4_K/Q6_K matrices that cannot be interleaved):
      // dequantize each row once and reuse it for every token.
      ForRowBlocks(w, out, n_tokens, pool, [&](int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
        MatMulRowsDequantized(w, r0, r1, x, t0, t1, out);
      });
      return;
  }
}

void MatMulSharedInput(std::span<const MatMulOutput> products, const float* x, int64_t n_tokens,
                       ThreadPool& pool) {
  if (products.empty() || n_tokens == 0) return;
  const InterleavedActs form = ActsOf(*products[0].w);
  bool shared = form.kind != InterleavedActs::kNone;
  for (const MatMulOutput& p : products) {
    KVS_CHECK(p.w->cols == products[0].w->cols);
    KVS_CHECK(p.w->row_bytes >= RowBytes(p.w->type, static_cast<size_t>(p.w->cols)));
    shared = shared && ActsOf(*p.w) == form && p.w->rows % static_cast<int64_t>(kRowGrain) == 0;
  }
  if (!shared) {  // mixed forms: each matrix quantizes its own input
    for (const MatMulOutput& p : products) MatMul(*p.w, x, n_tokens, p.out, pool);
    return;
  }
  MatMulInterleaved(products, form, x, n_tokens, pool);
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
