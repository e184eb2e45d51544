// Weight matrix x activations, the bulk of every forward pass.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/thread_pool.h"
#include "tensor/dtype.h"

namespace kvs {

// How a matrix's rows lie in memory. kRows is the file's layout. kInterleaved16 (kernels/repack.h)
// stores each group of 16 rows block by block, with the 16 rows' codes of one block side by
// side, so that one 512-bit load feeds a dpbusd for 16 rows at once; done at load time for the
// types that have such a kernel.
enum class WeightLayout : uint8_t { kRows, kInterleaved16 };

// A [rows][cols] weight matrix in its stored type (row-major, each row RowBytes(type, cols)).
// GGUF's dims are {cols, rows}.
struct MatrixView {
  DType type = DType::kF32;
  const uint8_t* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  size_t row_bytes = 0;
  WeightLayout layout = WeightLayout::kRows;

  // Row r's bytes in the file's layout; interleaved matrices have no contiguous rows (read
  // them with ReadRow in kernels/repack.h).
  const uint8_t* row(int64_t r) const { return data + static_cast<size_t>(r) * row_bytes; }
};

// out[t][r] = sum_c W[r][c] * x[t][c] for t < n_tokens.
// x is [n_tokens][cols] f32, out is [n_tokens][rows] f32. Rows are split over the pool.
void MatMul(const MatrixView& w, const float* x, int64_t n_tokens, float* out, ThreadPool& pool);

// One product of MatMulSharedInput: out is [n_tokens][w->rows].
struct MatMulOutput {
  const MatrixView* w;
  float* out;
};

// MatMul for several matrices of one input x[n_tokens][cols] (a layer's q, k and v, or its gate
// and up): where the matrices' kernels read the same activation form the input is quantized
// once, and all their rows go over the pool in one pass, one hand-off instead of one per
// matrix. Each out is bit-identical to MatMul's.
void MatMulSharedInput(std::span<const MatMulOutput> products, const float* x, int64_t n_tokens,
                       ThreadPool& pool);

// Scalar twin of MatMul: dequantizes each row and accumulates in double. Tests only.
void MatMulReference(const MatrixView& w, const float* x, int64_t n_tokens, float* out);

}  // namespace kvs
