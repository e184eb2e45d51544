// Load-time repacking of weight matrices into WeightLayout::kInterleaved16.
//
// A group of 16 rows is stored block by block. For each 32-value block the group holds the 16
// rows' f16 scales (32 bytes), then the rows' codes four bytes at a time: chunk s is 16 x 4
// bytes, row i's bytes at 4 * i. A 512-bit load of a chunk is thus one dpbusd operand for 16
// rows, each 32-bit lane of which meets the same four activations (broadcast), and the lane
// sums land in the 16 rows' own output lanes: no horizontal reduction, and the block's scale
// work is shared by 16 rows instead of done per row.
//   Q4_0 (288 bytes per group-block): chunk k < 4 holds each row's qs[4k .. 4k+3]; its low
//     nibbles are values 4k..4k+3 and its high nibbles values 16+4k..16+4k+3 (codes 0..15).
//   Q5_0 (352 bytes per group-block; AVX2 level only): Q4_0's 256 bytes of nibbles, then for each
//     chunk k < 4 a byte per row of the values' fifth bits: bits 0-3 those of values 4k..4k+3,
//     bits 4-7 those of values 16+4k..16+4k+3 (codes value + 16, 0..31).
//   Q8_0 (544 bytes per group-block): chunk s < 8 holds values 4s..4s+3 as unsigned codes
//     (value + 128), so that the weights are dpbusd's unsigned operand without a conversion.
//   F32, F16, BF16 (16 x 32 values per group-block): value j of the 16 rows side by side, one
//     vector per column, multiplied by a broadcast activation.
// The layout is the same size as the rows it replaces, so it is done in place.
#pragma once

#include <cstdint>

#include "kernels/matmul.h"

namespace kvs {

inline constexpr int64_t kInterleaveRows = 16;

// Whether w can be interleaved in this build: a type with an interleaved kernel, rows a
// multiple of 16, rows packed without padding, and still in the file's layout.
bool CanInterleave(const MatrixView& w);

// Rewrites the matrix in place (data must be w->data, writable) and marks it interleaved.
// Requires CanInterleave(*w).
void InterleaveRows(MatrixView* w, uint8_t* data);

// Dequantizes row r to out[0, cols) whatever the layout (the embedding lookup, tests).
void ReadRow(const MatrixView& w, int64_t r, float* out);

}  // namespace kvs
