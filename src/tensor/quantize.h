// Conversions between F32 and the stored weight formats, one row at a time.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/dtype.h"

namespace kvs {

// Converts n values (a multiple of the block size) of type t at src into floats.
void DequantizeRow(DType t, const void* src, float* dst, int64_t n);

// Converts n floats into type t at dst (RowBytes(t, n) bytes). Supported: f32, f16, bf16,
// q8_0, q4_0.
void QuantizeRow(DType t, const float* src, void* dst, int64_t n);

// rows x cols floats -> bytes of type t (each row quantized independently).
std::vector<uint8_t> QuantizeMatrix(DType t, const float* src, int64_t rows, int64_t cols);

}  // namespace kvs
