// Scalar quantize/dequantize of one head vector in a head block (layouts in kv_types.h), the
// rotation of the quantized types, and the codebooks. The write path uses these directly (a token's
// K/V is written once); the attention kernel has its own vector loaders and uses these as the
// scalar twin it is tested against.
#pragma once

#include <cstdint>

#include "kernels/kv_types.h"

namespace kvs {

// Stores x[head_dim] as position pos (0..15) of a head block. Rotated types rotate x first.
void StoreKey(KvType t, uint8_t* head_block, int32_t head_dim, int32_t pos, const float* x);
void StoreValue(KvType t, uint8_t* head_block, int32_t head_dim, int32_t pos, const float* x);

// Copies the stored key (or value) of position src_pos of one head block to position dst_pos of
// another (or the same), as codes and scales: bytes, never requantized, so a moved key reads back
// exactly as it did. What compaction does to the keys it keeps. len > 1 moves positions
// [src_pos, src_pos + len) to [dst_pos, dst_pos + len) (all within the blocks); in one block
// dst_pos <= src_pos, as compaction's moves are.
void MoveKey(KvType t, const uint8_t* src_block, int32_t src_pos, uint8_t* dst_block,
             int32_t dst_pos, int32_t head_dim, int32_t len = 1);
void MoveValue(KvType t, const uint8_t* src_block, int32_t src_pos, uint8_t* dst_block,
               int32_t dst_pos, int32_t head_dim, int32_t len = 1);

// The stored element (dim, pos), dequantized; for rotated types in the rotated basis.
float LoadKey(KvType t, const uint8_t* head_block, int32_t head_dim, int32_t dim, int32_t pos);
float LoadValue(KvType t, const uint8_t* head_block, int32_t head_dim, int32_t pos, int32_t dim);
// Every element of position pos at once: x[head_dim] (LoadKey / LoadValue of each dim).
void LoadKeyVector(KvType t, const uint8_t* head_block, int32_t head_dim, int32_t pos, float* x);
void LoadValueVector(KvType t, const uint8_t* head_block, int32_t head_dim, int32_t pos, float* x);

// The rotation R of the quantized types: x <- R x and x <- R^T x. R is orthogonal: a sign flip per
// dim (fixed pseudo-random signs), then a normalized Walsh-Hadamard transform on blocks of the
// largest power of two dividing n (n itself for 8, 64, 128, 256; 16 blocks of 16 dims for 80).
void RotateForward(float* x, int32_t n);
void RotateBack(float* x, int32_t n);

// Dequantized value of each code of a codebook type (q4_0: -8..7; turbo4: 16 Lloyd-Max levels
// of a unit Gaussian; turbo3: 8 levels, then zeros). 16 floats; nullptr for other types.
const float* KvCodebook(KvType t);
// e4m3 (fp8) byte to float, and the nearest e4m3 byte to x (|x| <= 448, ties to even).
float E4m3ToF32(uint8_t b);
uint8_t F32ToE4m3(float x);

}  // namespace kvs
