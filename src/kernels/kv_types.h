// Element types of the KV cache, chosen separately for K and V, and the layout of one KV head's
// 16 positions (a "head block") in each. A head block holds its data and then its scales:
//   keys   data [head_dim][16 positions]   scales f16 [n_groups][16]   (transposed, as attention
//                                                                        reads 16 keys per dim)
//   values data [16 positions][head_dim]   scales f16 [16][n_groups]
// Every quantized type first applies a fixed randomized Hadamard rotation to the head vector
// (queries get the same one, so q.k is unchanged; attention outputs are rotated back): it spreads
// the few large channels real keys carry over all dims, so no group's scale is set by one outlier.
// Then each group of consecutive dims gets one f16 scale:
//   q8_0, q4_0     groups of 32 dims (16 or 8 where head_dim needs it), codes as GGML's formats
//   int8, fp8      one group per head vector (e4m3 for fp8)
//   turbo4/turbo3  4- or 3-bit codes into a Lloyd-Max codebook for a unit Gaussian (what rotated
//                  coordinates look like) with the scale that minimises the group's squared
//                  error; groups as q8_0's
// 4- and 3-bit keys of heads up to 16 dims are whitened before the rotation (key_whitening.h).
// Packing inside data: 4-bit codes two per byte (element 2i low nibble, 2i+1 high); 3-bit codes
// in runs of 16 (8 at a row's end) as a plane of 2-bit low parts then a plane of high bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

namespace kvs {

enum class KvType : uint8_t { kF32, kF16, kBF16, kQ8_0, kQ4_0, kInt8, kFp8, kTurbo4, kTurbo3 };

inline constexpr KvType kAllKvTypes[] = {KvType::kF32,  KvType::kF16,    KvType::kBF16,
                                         KvType::kQ8_0, KvType::kQ4_0,   KvType::kInt8,
                                         KvType::kFp8,  KvType::kTurbo4, KvType::kTurbo3};

// The types of a cache: K and V separately.
struct KvTypes {
  KvType k = KvType::kF32;
  KvType v = KvType::kF32;
};

std::string_view KvTypeName(KvType t);
// "f32", "q8_0", ... (case-insensitive); the error lists the valid names.
Expected<KvType> ParseKvType(std::string_view name);
// "f32, f16, ..." for help texts.
std::string KvTypeNames();

// Bits of one stored code (32, 16, 8, 4 or 3).
int32_t KvCodeBits(KvType t);
bool KvTypeIsQuantized(KvType t);  // carries scales
bool KvTypeIsRotated(KvType t);    // all quantized types
// Dims per scale for a head vector of head_dim (0 for the float types).
// Whether keys of type t are stored less an offset that follows RoPE to each key's position
// (exact at every position; attention adds q·R(p)·m back per block, which costs about as much as
// the scores themselves) rather than one offset averaged over the context's positions (free: a
// constant offset leaves softmax unchanged). The exact one pays where codes are few: 4 and 3 bits.
bool KvKeyOffsetFollowsRope(KvType t);

int32_t KvGroupSize(KvType t, int32_t head_dim);
// Whether head_dim can be stored as t (quantized types need a multiple of 8).
Status ValidateKvType(KvType t, int32_t head_dim);

// Bytes of one head block (16 positions of one KV head), data and scales, K or V alike.
size_t KvHeadBlockBytes(KvType t, int32_t head_dim);
// Bytes of one value row (data only) and offset of the value scales in a head block.
size_t KvValueRowBytes(KvType t, int32_t head_dim);
// Storage bits per element, scales included.
double KvBitsPerElement(KvType t, int32_t head_dim);

}  // namespace kvs
