// Element-wise and row-wise operations of the forward pass (everything except matmul and
// attention). Plain loops the compiler vectorizes; each has a scalar meaning stated here.
#pragma once

#include <cstdint>

namespace kvs {

// out = x / sqrt(mean(x^2) + eps) * weight   (weight may be null: no scaling)
void RmsNorm(const float* x, const float* weight, int64_t n, float eps, float* out);

// Rotary position embedding of one head vector in place, on its first n_rot dims.
// Normal mode rotates adjacent pairs (x[2i], x[2i+1]); NeoX mode rotates (x[i], x[i+n_rot/2]).
// Pair i turns by pos * freq_scale * base^(-2i/n_rot) / freq_factors[i] (factors optional).
struct RopeParams {
  int32_t n_rot = 0;
  float freq_base = 10000.f;
  float freq_scale = 1.f;
  bool neox = false;
  const float* freq_factors = nullptr;  // [n_rot/2] or null
};
// The angles depend only on the position, so they are computed once per token
// (RopeAngles, into cos_sin[n_rot]: cos in the first half, sin in the second) and applied
// to every head of every layer (ApplyRope).
void RopeAngles(int32_t pos, const RopeParams& p, float* cos_sin);
// Pair i's turn per position before freq_scale (base^(-2i/n_rot), over its freq factor): pair i
// turns by pos * freq_scale * RopeFrequency(i, p) radians. RopeAngles computes it this way, so
// what reads the angles elsewhere (the tri eviction policy's calibration) matches bit for bit.
double RopeFrequency(int32_t i, const RopeParams& p);
void ApplyRope(float* x, const float* cos_sin, int32_t n_rot, bool neox);
// The two dims RoPE turns together as pair i < n_rot / 2 (adjacent, or half apart for neox).
struct RopePair {
  int32_t a, b;
};
inline RopePair RopePairDims(int32_t i, int32_t n_rot, bool neox) {
  return neox ? RopePair{i, i + n_rot / 2} : RopePair{2 * i, 2 * i + 1};
}

// In-place softmax over n values.
void Softmax(float* x, int64_t n);

// out[i] = silu(gate[i]) * up[i]
void SwiGlu(const float* gate, const float* up, float* out, int64_t n);
// out[i] = gelu(gate[i]) * up[i], GELU in its tanh approximation (Gemma's GeGLU):
// gelu(g) = g / 2 * (1 + tanh(sqrt(2/pi) * (g + 0.044715 g^3)))
void GeGluTanh(const float* gate, const float* up, float* out, int64_t n);

float DotF32(const float* a, const float* b, int64_t n);
// Scalar twin of DotF32 (double accumulation), for tests.
float DotF32Reference(const float* a, const float* b, int64_t n);
// y += a * x
void Axpy(float a, const float* x, float* y, int64_t n);
// y += x
void AddInPlace(float* y, const float* x, int64_t n);

}  // namespace kvs
