// Keys of small heads coded in their own whitened basis.
// At head_dim 8 or 16 a fixed Hadamard rotation has too few dims to spread over: a trained
// model's keys (before RoPE, less their mean) are far from isotropic — stories260K's covariance
// has one direction with 10-100x the variance of the others — and 3 or 4 bits spent alike on
// every rotated dim leave the directions queries actually read coded too coarsely. So the 4- and
// 3-bit types store such a head's key before RoPE, less its mean m, whitened:
//   y = W (k - m)        W = L^-1/2 U^T  from the head's key covariance U L U^T
// and then exactly as any rotated key (Hadamard, codes, per-position scale): every coordinate
// gets the same relative precision. Attention decodes a block of 16 keys back, k = m + F (R y)
// (F = U L^1/2 R^T, the store's rotation folded in), turns them by RoPE to their positions and
// scores them as f32; the cost is head_dim^2 FMAs per 16 keys, which only small heads can
// afford, and only they need it. On stories260K (head_dim 8) it takes turbo3 keys from +12.5% to
// +0.66% perplexity (turbo3 K and V: +13.0% to +1.2%), turbo4 K and V from +2.1% to +0.55%.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/kv_types.h"

namespace kvs {

inline constexpr int32_t kMaxWhitenedHeadDim = 16;

// One KV head's whitening, head_dim <= kMaxWhitenedHeadDim, matrices row-major [hd][hd].
struct KeyWhitening {
  float mean[kMaxWhitenedHeadDim] = {};                               // m
  float to_coords[kMaxWhitenedHeadDim * kMaxWhitenedHeadDim] = {};    // W
  float from_coords[kMaxWhitenedHeadDim * kMaxWhitenedHeadDim] = {};  // F = W^-1 R^T
};

// Whether keys of type t and head_dim are stored whitened: the 4- and 3-bit rotated types at
// head_dim <= kMaxWhitenedHeadDim.
bool KvKeysWhitened(KvType t, int32_t head_dim);

// The whitening of a head from n of its keys before RoPE, key i at keys[i * stride]: their mean
// and covariance. Each eigenvalue gets 1% of their mean added first, so a direction the
// calibration never saw vary is not blown up.
KeyWhitening FitKeyWhitening(const float* keys, int32_t n, size_t stride, int32_t head_dim);

// y[hd] = W (k - m): the coordinates of a key before RoPE (StoreKey then rotates and codes them).
void WhitenKey(const KeyWhitening& w, int32_t head_dim, const float* key, float* y);
// key[hd] = m + F stored: a key before RoPE from its stored (rotated) coordinates.
void UnwhitenKey(const KeyWhitening& w, int32_t head_dim, const float* stored, float* key);

}  // namespace kvs
