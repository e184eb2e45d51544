#include "kernels/repack.h"

#include <cstring>
#include <vector>

#include "core/check.h"
#include "kernels/matmul_internal.h"
#include "tensor/quantize.h"

namespace kvs {
namespace {

constexpr size_t kScaleBytes = 2 * kInterleaveRows;

// Bytes of one row's 32-value block in the file layout.
size_t BlockBytes(DType t) {
  return RowBytes(t, 32);
}

bool IsFloat(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

// Moves one row's block (file format) into its lane of a group-block, or back.
void PackBlock(DType t, const uint8_t* src, int lane, uint8_t* group_block) {
  if (IsFloat(t)) {
    const size_t size = Info(t).block_bytes;
    for (int j = 0; j < 32; ++j) {
      std::memcpy(group_block + (j * kInterleaveRows + lane) * size, src + j * size, size);
    }
    return;
  }
  std::memcpy(group_block + 2 * lane, src, 2);
  uint8_t* codes = group_block + kScaleBytes;
  if (t == DType::kQ4_0) {
    const auto* b = reinterpret_cast<const BlockQ4_0*>(src);
    for (int k = 0; k < 4; ++k) std::memcpy(codes + 64 * k + 4 * lane, b->qs + 4 * k, 4);
  } else {
    const auto* b = reinterpret_cast<const BlockQ8_0*>(src);
    for (int s = 0; s < 8; ++s)
      for (int j = 0; j < 4; ++j)
        codes[64 * s + 4 * lane + j] = static_cast<uint8_t>(b->qs[4 * s + j]) ^ 0x80;
  }
}

void UnpackBlock(DType t, const uint8_t* group_block, int lane, uint8_t* dst) {
  if (IsFloat(t)) {
    const size_t size = Info(t).block_bytes;
    for (int j = 0; j < 32; ++j) {
      std::memcpy(dst + j * size, group_block + (j * kInterleaveRows + lane) * size, size);
    }
    return;
  }
  std::memcpy(dst, group_block + 2 * lane, 2);
  const uint8_t* codes = group_block + kScaleBytes;
  if (t == DType::kQ4_0) {
    auto* b = reinterpret_cast<BlockQ4_0*>(dst);
    for (int k = 0; k < 4; ++k) std::memcpy(b->qs + 4 * k, codes + 64 * k + 4 * lane, 4);
  } else {
    auto* b = reinterpret_cast<BlockQ8_0*>(dst);
    for (int s = 0; s < 8; ++s)
      for (int j = 0; j < 4; ++j)
        b->qs[4 * s + j] = static_cast<int8_t>(codes[64 * s + 4 * lane + j] ^ 0x80);
  }
}

}  // namespace

bool CanInterleave(const MatrixView& w) {
  return w.layout == WeightLayout::kRows && matmul_internal::InterleavedKernelAvailable(w.type) &&
         w.rows > 0 && w.rows % kInterleaveRows == 0 && w.cols % 32 == 0 &&
         w.row_bytes == RowBytes(w.type, static_cast<size_t>(w.cols));
}

void InterleaveRows(MatrixView* w, uint8_t* data) {
  KVS_CHECK(CanInterleave(*w) && data == w->data);
  const size_t block_bytes = BlockBytes(w->type);
  const size_t group_block_bytes = kInterleaveRows * block_bytes;
  const size_t group_bytes = kInterleaveRows * w->row_bytes;
  const int64_t n_blocks = w->cols / 32;
  std::vector<uint8_t> rows(group_bytes);  // the group's 16 rows, file layout
  for (int64_t g = 0; g < w->rows / kInterleaveRows; ++g) {
    uint8_t* group = data + g * group_bytes;
    std::memcpy(rows.data(), group, group_bytes);
    for (int64_t b = 0; b < n_blocks; ++b) {
      for (int lane = 0; lane < kInterleaveRows; ++lane) {
        PackBlock(w->type, rows.data() + lane * w->row_bytes + b * block_bytes, lane,
                  group + b * group_block_bytes);
      }
    }
  }
  w->layout = WeightLayout::kInterleaved16;
}

void ReadRow(const MatrixView& w, int64_t r, float* out) {
  if (w.layout == WeightLayout::kRows) {
    DequantizeRow(w.type, w.row(r), out, w.cols);
    return;
  }
  const size_t block_bytes = BlockBytes(w.type);
  const uint8_t* group = w.data + (r / kInterleaveRows) * kInterleaveRows * w.row_bytes;
  const int lane = static_cast<int>(r % kInterleaveRows);
  uint8_t block[32 * sizeof(float)];
  for (int64_t b = 0; b < w.cols / 32; ++b) {
    UnpackBlock(w.type, group + b * kInterleaveRows * block_bytes, lane, block);
    DequantizeRow(w.type, block, out + 32 * b, 32);
  }
}

}  // namespace kvs
