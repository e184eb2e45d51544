// Transform coding of KV head vectors (issue #23), the math of the cold tiers' "tc" codec:
// decorrelate a head's vectors with their principal components (keys before RoPE, so that the
// basis does not depend on position), spend a budget of bits across the components by their
// variance, and quantize each coded component uniformly. Entropy coding of the codes is the
// codec's (engine/transform_codec.h); this file is per-vector arithmetic, tested against plain
// loops.
//
// Bit allocation: component i of variance s_i coded with b bits by the optimal uniform quantizer
// of a Gaussian has mean squared error s_i D(b) (D(0) = 1: a component not coded is its mean).
// D is convex and decreasing in b, so handing out the budget one bit at a time to the component
// whose error falls most is optimal among integer allocations (the marginal-analysis result that
// a dynamic program over the same table also finds), and it is reverse water-filling's integer
// form: components whose variance is below the water level get no bits at all.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace kvs {

inline constexpr int32_t kMaxTransformBits = 8;

// A head's PCA: vectors x ~ mean + sum_i c_i components[i], c_i of variance variance[i].
struct HeadTransform {
  int32_t dim = 0;
  std::vector<float> mean;        // [dim]
  std::vector<float> components;  // [dim][dim]: row i the i-th principal direction (unit norm)
  std::vector<float> variance;    // [dim], descending
};

// The PCA of n vectors of dim floats, vector i at x[i * stride]: their mean and the
// eigen-decomposition of their covariance. n >= 1.
HeadTransform FitHeadTransform(const float* x, int64_t n, size_t stride, int32_t dim);

// Relative mean squared error of the optimal uniform quantizer of a unit Gaussian with 2^bits
// levels (bits 0..kMaxTransformBits; 0: 1, the variance itself), and its step (in sigmas).
double UniformQuantizerError(int32_t bits);
double UniformQuantizerStep(int32_t bits);

// Bits per component for a budget of round(bits_per_element * dim) bits per vector, at most
// kMaxTransformBits each (greedy by largest error reduction; ties to the lower index).
std::vector<uint8_t> AllocateBits(std::span<const float> variance, double bits_per_element);

// A head's transform with its bits: only components with bits > 0 are kept (in variance order).
struct HeadCode {
  int32_t dim = 0;
  int32_t n_coded = 0;
  std::vector<float> mean;        // [dim]
  std::vector<float> components;  // [n_coded][dim]
  std::vector<uint8_t> bits;      // [n_coded], 1..kMaxTransformBits
  std::vector<float> step;        // [n_coded] quantizer step
  int32_t total_bits() const;     // per vector
};
HeadCode MakeHeadCode(const HeadTransform& transform, double bits_per_element);

// n vectors x[n][dim] to codes[n_coded][n] (component-major: one component's codes together,
// which is what the entropy coder sees), each code 0..2^bits-1 (clamped at the range's ends).
void EncodeHeadVectors(const HeadCode& code, const float* x, int32_t n, uint8_t* codes);
// codes[n_coded][n] back to x[n][dim].
void DecodeHeadVectors(const HeadCode& code, const uint8_t* codes, int32_t n, float* x);

// Packs codes (component-major, as above) at bits[i] bits each, least significant bit first,
// into out (appended); and back. n codes per component.
void PackCodes(const HeadCode& code, const uint8_t* codes, int32_t n, std::vector<uint8_t>* out);
// Returns false when in holds fewer bits than the codes need; *used: bytes read.
bool UnpackCodes(const HeadCode& code, std::span<const uint8_t> in, int32_t n, uint8_t* codes,
                 size_t* used);

}  // namespace kvs
