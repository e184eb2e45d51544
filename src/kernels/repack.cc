#include "kernels/repack.h"

#include <cstring>
#include <vector>

#include "core/check.h"
#include "kernels/cpu_isa.h"
#include "kernels/matmul_internal.h"
#include "tensor/kquants.h"
#include "tensor/quantize.h"

namespace kvs {
namespace {

constexpr size_t kScaleBytes = 2 * kInterleaveRows;

bool IsKQuant(DType t) {
  return t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K;
}

// Values per block: the unit that a group interleaves (a K-quant super-block, else 32).
int64_t BlockValues(DType t) {
  return IsKQuant(t) ? kSuperBlock : 32;
}

// Bytes of one row's block in the file layout.
size_t BlockBytes(DType t) {
  return RowBytes(t, static_cast<size_t>(BlockValues(t)));
}

// Q4_K group-block (2304 bytes): d[16] and dmin[16] (f16), then per sub-block j the 16 rows'
// scale | (min >> 4) << 6 (128 bytes), then the mins' low nibbles (64 bytes: byte 16 (j % 4) +
// lane, nibble j / 4), then 32 code chunks: chunk k's low nibbles are values 4k..4k+3 and its
// high nibbles values 128+4k..128+4k+3.
constexpr size_t kQ4KScales = 64, kQ4KMins = 192, kQ4KCodes = 256;

void PackQ4_K(const BlockQ4_K& b, int lane, uint8_t* gb) {
  std::memcpy(gb + 2 * lane, &b.d, 2);
  std::memcpy(gb + 32 + 2 * lane, &b.dmin, 2);
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    GetScaleMinK4(j, b.scales, &sc, &m);
    gb[kQ4KScales + 16 * j + lane] = static_cast<uint8_t>(sc | ((m >> 4) << 6));
    uint8_t& nib = gb[kQ4KMins + 16 * (j % 4) + lane];
    nib = static_cast<uint8_t>((j < 4 ? 0 : nib) | ((m & 0xF) << (4 * (j / 4))));
  }
  uint8_t code[kSuperBlock];
  for (int i = 0; i < kSuperBlock; ++i) {
    code[i] = (b.qs[32 * (i / 64) + i % 32] >> (4 * ((i % 64) / 32))) & 0xF;
  }
  for (int k = 0; k < 32; ++k)
    for (int j = 0; j < 4; ++j)
      gb[kQ4KCodes + 64 * k + 4 * lane + j] =
          static_cast<uint8_t>(code[4 * k + j] | (code[128 + 4 * k + j] << 4));
}

void UnpackQ4_K(const uint8_t* gb, int lane, BlockQ4_K* b) {
  std::memset(b, 0, sizeof(*b));
  std::memcpy(&b->d, gb + 2 * lane, 2);
  std::memcpy(&b->dmin, gb + 32 + 2 * lane, 2);
  for (int j = 0; j < 8; ++j) {
    const int s = gb[kQ4KScales + 16 * j + lane];
    const int nib = (gb[kQ4KMins + 16 * (j % 4) + lane] >> (4 * (j / 4))) & 0xF;
    SetScaleMinK4(j, s & 63, ((s >> 6) << 4) | nib, b->scales);
  }
  for (int i = 0; i < kSuperBlock; ++i) {
    const int k = (i % 128) / 4, j = i % 4;
    const int q = (gb[kQ4KCodes + 64 * k + 4 * lane + j] >> (4 * (i / 128))) & 0xF;
    b->qs[32 * (i / 64) + i % 32] |= static_cast<uint8_t>(q << (4 * ((i % 64) / 32)));
  }
}

// Q5_K group-block (2816 bytes, 16 rows' blocks): Q4_K's group-block of the low four bits, then
// the fifth bits as 8 bit-planes of 64 bytes: plane 2 * jj + half (half 0: low nibbles, 1: high)
// has, in byte 4 * lane + j, bit s set for value 128 * half + 4 * (8 * jj + s) + j, so a byte
// lines up with its code bytes in chunks 8 * jj .. 8 * jj + 7 and the kernel moves bit s to the
// code's bit 4 with one shift.
constexpr size_t kQ5KHigh = 2304;

BlockQ4_K LowBits(const BlockQ5_K& b) {
  BlockQ4_K q;
  q.d = b.d;
  q.dmin = b.dmin;
  std::memcpy(q.scales, b.scales, sizeof(q.scales));
  std::memcpy(q.qs, b.qs, sizeof(q.qs));
  return q;
}

int FifthBit(const BlockQ5_K& b, int i) {
  return (b.qh[i % 32] >> (i / 32)) & 1;
}

// The value of bit s of plane byte (jj, half, j).
int Q5KPlaneValue(int jj, int half, int j, int s) {
  return 128 * half + 4 * (8 * jj + s) + j;
}

void PackQ5_K(const BlockQ5_K& b, int lane, uint8_t* gb) {
  PackQ4_K(LowBits(b), lane, gb);
  for (int jj = 0; jj < 4; ++jj)
    for (int half = 0; half < 2; ++half)
      for (int j = 0; j < 4; ++j) {
        int bits = 0;
        for (int s = 0; s < 8; ++s) bits |= FifthBit(b, Q5KPlaneValue(jj, half, j, s)) << s;
        gb[kQ5KHigh + 128 * jj + 64 * half + 4 * lane + j] = static_cast<uint8_t>(bits);
      }
}

void UnpackQ5_K(const uint8_t* gb, int lane, BlockQ5_K* b) {
  BlockQ4_K q;
  UnpackQ4_K(gb, lane, &q);
  b->d = q.d;
  b->dmin = q.dmin;
  std::memcpy(b->scales, q.scales, sizeof(q.scales));
  std::memcpy(b->qs, q.qs, sizeof(q.qs));
  std::memset(b->qh, 0, sizeof(b->qh));
  for (int jj = 0; jj < 4; ++jj)
    for (int half = 0; half < 2; ++half)
      for (int j = 0; j < 4; ++j) {
        const int bits = gb[kQ5KHigh + 128 * jj + 64 * half + 4 * lane + j];
        for (int s = 0; s < 8; ++s) {
          const int i = Q5KPlaneValue(jj, half, j, s);
          b->qh[i % 32] |= static_cast<uint8_t>(((bits >> s) & 1) << (i / 32));
        }
      }
}

// Q6_K group-block (3360 bytes): d[16] (f16), scales [16 sub-blocks][16 rows] (int8), then the
// codes in one of two forms, by the level in force (each level's tile reads its own):
// - AVX-512: 32 chunks of low nibbles (chunk c: values 4c.. low, 128+4c.. high), then 16 chunks
//   of top bits (chunk m, byte j: bits 2i..2i+1 belong to value 64i + 4m + j).
// - AVX2: per m (0..15) three chunks b0, b1, b2 (64 bytes each, byte 4 * lane + j): with
//   v_i = the code of value 64i + 4m + j, b_p = v_p | (bits 2p..2p+1 of v3) << 6, so that v0..v2
//   are one mask each and v3 three shifts and masks (17 operations for the four in the other
//   form, 11 in this one: the AVX2 tile is bound by them).
constexpr size_t kQ6KScales = 32, kQ6KLow = 288, kQ6KHigh = 2336;

bool Q6KAvx2Form() {
  return ActiveIsa() == Isa::kAvx2;
}

void PackQ6_K(const BlockQ6_K& b, int lane, uint8_t* gb) {
  std::memcpy(gb + 2 * lane, &b.d, 2);
  for (int k = 0; k < 16; ++k) gb[kQ6KScales + 16 * k + lane] = static_cast<uint8_t>(b.scales[k]);
  uint8_t code[kSuperBlock];
  for (int i = 0; i < kSuperBlock; ++i) code[i] = static_cast<uint8_t>(Q6KCode(b, i));
  if (Q6KAvx2Form()) {
    for (int m = 0; m < 16; ++m) {
      for (int j = 0; j < 4; ++j) {
        const int v3 = code[192 + 4 * m + j];
        for (int p = 0; p < 3; ++p) {
          gb[kQ6KLow + 192 * m + 64 * p + 4 * lane + j] =
              static_cast<uint8_t>(code[64 * p + 4 * m + j] | (((v3 >> (2 * p)) & 3) << 6));
        }
      }
    }
    return;
  }
  for (int c = 0; c < 32; ++c)
    for (int j = 0; j < 4; ++j)
      gb[kQ6KLow + 64 * c + 4 * lane + j] =
          static_cast<uint8_t>((code[4 * c + j] & 0xF) | ((code[128 + 4 * c + j] & 0xF) << 4));
  for (int m = 0; m < 16; ++m) {
    for (int j = 0; j < 4; ++j) {
      int bits = 0;
      for (int i = 0; i < 4; ++i) bits |= (code[64 * i + 4 * m + j] >> 4) << (2 * i);
      gb[kQ6KHigh + 64 * m + 4 * lane + j] = static_cast<uint8_t>(bits);
    }
  }
}

void UnpackQ6_K(const uint8_t* gb, int lane, BlockQ6_K* b) {
  std::memset(b, 0, sizeof(*b));
  std::memcpy(&b->d, gb + 2 * lane, 2);
  for (int k = 0; k < 16; ++k) b->scales[k] = static_cast<int8_t>(gb[kQ6KScales + 16 * k + lane]);
  const bool avx2_form = Q6KAvx2Form();
  for (int i = 0; i < kSuperBlock; ++i) {
    const int m = (i % 64) / 4, j = i % 4, p = i / 64;
    if (avx2_form) {
      const uint8_t* chunks = gb + kQ6KLow + 192 * m + 4 * lane + j;
      const int code =
          p < 3 ? chunks[64 * p] & 63
                : (chunks[0] >> 6) | ((chunks[64] >> 6) << 2) | ((chunks[128] >> 6) << 4);
      SetQ6KCode(b, i, code);
      continue;
    }
    const int c = (i % 128) / 4;
    const int low = (gb[kQ6KLow + 64 * c + 4 * lane + j] >> (4 * (i / 128))) & 0xF;
    const int high = (gb[kQ6KHigh + 64 * m + 4 * lane + j] >> (2 * p)) & 3;
    SetQ6KCode(b, i, low | (high << 4));
  }
}

bool IsFloat(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

// Moves one row's block (file format) into its lane of a group-block, or back.
void PackBlock(DType t, const uint8_t* src, int lane, uint8_t* group_block) {
  if (t == DType::kQ4_K)
    return PackQ4_K(*reinterpret_cast<const BlockQ4_K*>(src), lane, group_block);
  if (t == DType::kQ5_K)
    return PackQ5_K(*reinterpret_cast<const BlockQ5_K*>(src), lane, group_block);
  if (t == DType::kQ6_K)
    return PackQ6_K(*reinterpret_cast<const BlockQ6_K*>(src), lane, group_block);
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
  } else if (t == DType::kQ5_0) {
    const auto* b = reinterpret_cast<const BlockQ5_0*>(src);
    uint32_t qh;
    std::memcpy(&qh, b->qh, 4);
    for (int k = 0; k < 4; ++k) {
      std::memcpy(codes + 64 * k + 4 * lane, b->qs + 4 * k, 4);
      codes[256 + 16 * k + lane] =
          static_cast<uint8_t>(((qh >> (4 * k)) & 0xf) | (((qh >> (16 + 4 * k)) & 0xf) << 4));
    }
  } else {
    const auto* b = reinterpret_cast<const BlockQ8_0*>(src);
    for (int s = 0; s < 8; ++s)
      for (int j = 0; j < 4; ++j)
        codes[64 * s + 4 * lane + j] = static_cast<uint8_t>(b->qs[4 * s + j]) ^ 0x80;
  }
}

void UnpackBlock(DType t, const uint8_t* group_block, int lane, uint8_t* dst) {
  if (t == DType::kQ4_K) return UnpackQ4_K(group_block, lane, reinterpret_cast<BlockQ4_K*>(dst));
  if (t == DType::kQ5_K) return UnpackQ5_K(group_block, lane, reinterpret_cast<BlockQ5_K*>(dst));
  if (t == DType::kQ6_K) return UnpackQ6_K(group_block, lane, reinterpret_cast<BlockQ6_K*>(dst));
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
  } else if (t == DType::kQ5_0) {
    auto* b = reinterpret_cast<BlockQ5_0*>(dst);
    uint32_t qh = 0;
    for (int k = 0; k < 4; ++k) {
      std::memcpy(b->qs + 4 * k, codes + 64 * k + 4 * lane, 4);
      const uint32_t bits = codes[256 + 16 * k + lane];
      qh |= (bits & 0xf) << (4 * k) | (bits >> 4) << (16 + 4 * k);
    }
    std::memcpy(b->qh, &qh, 4);
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
         w.rows > 0 && w.rows % kInterleaveRows == 0 && w.cols % BlockValues(w.type) == 0 &&
         w.row_bytes == RowBytes(w.type, static_cast<size_t>(w.cols));
}

void InterleaveRows(MatrixView* w, uint8_t* data) {
  KVS_CHECK(CanInterleave(*w) && data == w->data);
  const size_t block_bytes = BlockBytes(w->type);
  const size_t group_block_bytes = kInterleaveRows * block_bytes;
  const size_t group_bytes = kInterleaveRows * w->row_bytes;
  const int64_t n_blocks = w->cols / BlockValues(w->type);
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
  const int64_t values = BlockValues(w.type);
  alignas(8) uint8_t block[256];
  for (int64_t b = 0; b < w.cols / values; ++b) {
    UnpackBlock(w.type, group + b * kInterleaveRows * block_bytes, lane, block);
    DequantizeRow(w.type, block, out + values * b, values);
  }
}

}  // namespace kvs
