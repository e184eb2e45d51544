#include "tensor/quantize.h"

#include "tensor/kquants.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/check.h"

namespace kvs {
namespace {

// Both block quantizers multiply by the reciprocal of the unrounded scale and store the scale
// rounded to f16 afterwards, as ggml does, so that files we write quantize like the peer's.

void QuantizeBlockQ8_0(const float* x, BlockQ8_0* y) {
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  y->d = F32ToF16(d);
  for (int j = 0; j < 32; ++j) {
    // A value that does not scale to a finite number (NaN or Inf in the block, or 1 / d
    // overflowing for a block below ~1e-37) gets code 0, at every kernel level alike.
    const float v = x[j] * id;
    y->qs[j] = std::isfinite(v) ? static_cast<int8_t>(std::round(v)) : int8_t{0};
  }
}

void QuantizeBlockQ4_0(const float* x, BlockQ4_0* y) {
  // The signed extreme maps to -8 exactly, using the full [-8, 7] range on that side.
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < 32; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  y->d = F32ToF16(d);
  for (int j = 0; j < 16; ++j) {
    int lo = std::min(15, static_cast<int>(x[j] * id + 8.5f));
    int hi = std::min(15, static_cast<int>(x[j + 16] * id + 8.5f));
    y->qs[j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

}  // namespace

void DequantizeRow(DType t, const void* src, float* dst, int64_t n) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = F16ToF32(s[i]);
      return;
    }
    case DType::kBF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = BF16ToF32(s[i]);
      return;
    }
    case DType::kQ8_0: {
      KVS_CHECK(n % 32 == 0);
      const BlockQ8_0* b = static_cast<const BlockQ8_0*>(src);
      for (int64_t i = 0; i < n / 32; ++i) {
        const float d = F16ToF32(b[i].d);
        for (int j = 0; j < 32; ++j) dst[i * 32 + j] = b[i].qs[j] * d;
      }
      return;
    }
    case DType::kQ4_0: {
      KVS_CHECK(n % 32 == 0);
      const BlockQ4_0* b = static_cast<const BlockQ4_0*>(src);
      for (int64_t i = 0; i < n / 32; ++i) {
        const float d = F16ToF32(b[i].d);
        for (int j = 0; j < 16; ++j) {
          dst[i * 32 + j] = ((b[i].qs[j] & 0x0f) - 8) * d;
          dst[i * 32 + j + 16] = ((b[i].qs[j] >> 4) - 8) * d;
        }
      }
      return;
    }
    default: {
      // Q4_1, Q5_x and the K-quants live in kquants.cc.
      const bool handled = DequantizeRowKQuant(t, src, dst, n);
      KVS_CHECK(handled && "DequantizeRow: unsupported type");
    }
  }
}

void QuantizeRow(DType t, const float* src, void* dst, int64_t n) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = F32ToF16(src[i]);
      return;
    }
    case DType::kBF16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) d[i] = F32ToBF16(src[i]);
      return;
    }
    case DType::kQ8_0: {
      KVS_CHECK(n % 32 == 0);
      BlockQ8_0* b = static_cast<BlockQ8_0*>(dst);
      for (int64_t i = 0; i < n / 32; ++i) QuantizeBlockQ8_0(src + i * 32, &b[i]);
      return;
    }
    case DType::kQ4_0: {
      KVS_CHECK(n % 32 == 0);
      BlockQ4_0* b = static_cast<BlockQ4_0*>(dst);
      for (int64_t i = 0; i < n / 32; ++i) QuantizeBlockQ4_0(src + i * 32, &b[i]);
      return;
    }
    default: {
      const bool handled = QuantizeRowKQuant(t, src, dst, n);
      KVS_CHECK(handled && "QuantizeRow: unsupported type");
    }
  }
}

std::vector<uint8_t> QuantizeMatrix(DType t, const float* src, int64_t rows, int64_t cols) {
  const size_t row_bytes = RowBytes(t, static_cast<size_t>(cols));
  std::vector<uint8_t> out(row_bytes * static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r)
    QuantizeRow(t, src + r * cols, out.data() + r * row_bytes, cols);
  return out;
}

}  // namespace kvs
