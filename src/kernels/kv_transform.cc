#include "kernels/kv_transform.h"

#include <algorithm>
#include <cmath>
#ifdef __BMI2__
#include <immintrin.h>
#endif
#include <cstring>
#include <numeric>

#include "core/check.h"
#include "kernels/symmetric_eigen.h"

namespace kvs {
namespace {

// The optimal uniform quantizer of a unit Gaussian with 2^b levels (Max 1960, Table 1; b >= 5
// from the high-rate fit step ~ 4.3 * 2^-b, error ~ step^2 / 12 plus overload): its step and its
// mean squared error.
constexpr double kStep[kMaxTransformBits + 1] = {0,      1.596,  0.9957, 0.5860, 0.3352,
                                                 0.1881, 0.1041, 0.0569, 0.0308};
constexpr double kError[kMaxTransformBits + 1] = {1.0,      0.3634,   0.1188,    0.03744,   0.01154,
                                                  0.003490, 0.001041, 0.0003071, 0.00008898};

}  // namespace

double UniformQuantizerError(int32_t bits) {
  KVS_CHECK(bits >= 0 && bits <= kMaxTransformBits);
  return kError[bits];
}

double UniformQuantizerStep(int32_t bits) {
  KVS_CHECK(bits >= 0 && bits <= kMaxTransformBits);
  return kStep[bits];
}

HeadTransform FitHeadTransform(const float* x, int64_t n, size_t stride, int32_t dim) {
  KVS_CHECK(n >= 1 && dim >= 1);
  const size_t d = static_cast<size_t>(dim);
  std::vector<double> mean(d, 0.0), cov(d * d, 0.0), eig(d), vec(d * d), centred(d);
  for (int64_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < d; ++j) mean[j] += x[i * stride + j];
  }
  for (double& m : mean) m /= static_cast<double>(n);
  for (int64_t i = 0; i < n; ++i) {
    for (size_t j = 0; j < d; ++j) centred[j] = x[i * stride + j] - mean[j];
    for (size_t r = 0; r < d; ++r) {
      for (size_t c = r; c < d; ++c) cov[r * d + c] += centred[r] * centred[c];
    }
  }
  for (size_t r = 0; r < d; ++r) {
    for (size_t c = r; c < d; ++c) {
      cov[r * d + c] /= static_cast<double>(n);
      cov[c * d + r] = cov[r * d + c];
    }
  }
  SymmetricEigen(cov.data(), dim, eig.data(), vec.data());
  std::vector<int32_t> order(d);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return eig[a] > eig[b]; });
  HeadTransform t;
  t.dim = dim;
  t.mean.assign(mean.begin(), mean.end());
  t.components.resize(d * d);
  t.variance.resize(d);
  for (size_t i = 0; i < d; ++i) {
    t.variance[i] = static_cast<float>(std::max(eig[order[i]], 0.0));
    for (size_t j = 0; j < d; ++j)
      t.components[i * d + j] = static_cast<float>(vec[j * d + order[i]]);
  }
  return t;
}

std::vector<uint8_t> AllocateBits(std::span<const float> variance, double bits_per_element) {
  const size_t d = variance.size();
  std::vector<uint8_t> bits(d, 0);
  int64_t budget = std::llround(std::max(bits_per_element, 0.0) * static_cast<double>(d));
  budget = std::min<int64_t>(budget, static_cast<int64_t>(d) * kMaxTransformBits);
  for (; budget > 0; --budget) {
    size_t best = d;
    double best_gain = 0.0;
    for (size_t i = 0; i < d; ++i) {
      if (bits[i] >= kMaxTransformBits) continue;
      const double gain = variance[i] * (kError[bits[i]] - kError[bits[i] + 1]);
      if (gain > best_gain) {
        best_gain = gain;
        best = i;
      }
    }
    if (best == d) break;  // nothing left with variance to code
    ++bits[best];
  }
  return bits;
}

int32_t HeadCode::total_bits() const {
  return std::accumulate(bits.begin(), bits.end(), 0);
}

HeadCode MakeHeadCode(const HeadTransform& t, double bits_per_element) {
  const std::vector<uint8_t> bits = AllocateBits(t.variance, bits_per_element);
  HeadCode c;
  c.dim = t.dim;
  c.mean = t.mean;
  for (int32_t i = 0; i < t.dim; ++i) {
    if (bits[i] == 0) continue;
    c.components.insert(c.components.end(), t.components.begin() + static_cast<size_t>(i) * t.dim,
                        t.components.begin() + static_cast<size_t>(i + 1) * t.dim);
    c.bits.push_back(bits[i]);
    c.step.push_back(static_cast<float>(kStep[bits[i]] * std::sqrt(t.variance[i])));
  }
  c.n_coded = static_cast<int32_t>(c.bits.size());
  return c;
}

namespace {

constexpr int32_t kEncodeLanes = 16;  // positions projected together (a block's 16: one zmm)

// Projections of the positions in xt ([dim][kEncodeLanes], centred) on components [i0, i0 + C):
// s[c][p] = sum_d u_{i0+c}[d] * xt[d][p], summed over d in order. C accumulators in flight
// hide the multiply-add latency.
// 16 floats as one vector (a zmm with AVX-512, two ymm with AVX2, what the target has
// otherwise): GCC and Clang's vector extension, so the lanes are the positions, as meant.
typedef float Lanes16 __attribute__((vector_size(kEncodeLanes * sizeof(float))));

template <int32_t C>
void ProjectTile(const HeadCode& c, const float* xt, int32_t i0, float (*s)[kEncodeLanes]) {
  Lanes16 acc[C];
  for (int32_t k = 0; k < C; ++k) acc[k] = Lanes16{};
  const float* u = c.components.data() + static_cast<size_t>(i0) * c.dim;
  for (int32_t d = 0; d < c.dim; ++d) {
    Lanes16 xd;
    std::memcpy(&xd, xt + static_cast<size_t>(d) * kEncodeLanes, sizeof(xd));
    for (int32_t k = 0; k < C; ++k) acc[k] += u[static_cast<size_t>(k) * c.dim + d] * xd;
  }
  for (int32_t k = 0; k < C; ++k) std::memcpy(s[k], &acc[k], sizeof(acc[k]));
}

}  // namespace

void EncodeHeadVectors(const HeadCode& c, const float* x, int32_t n, uint8_t* codes) {
  thread_local std::vector<float> xt;  // [dim][kEncodeLanes]
  xt.assign(static_cast<size_t>(c.dim) * kEncodeLanes, 0.0f);
  float s[4][kEncodeLanes];
  for (int32_t j0 = 0; j0 < n; j0 += kEncodeLanes) {
    const int32_t m = std::min(kEncodeLanes, n - j0);
    for (int32_t p = 0; p < m; ++p) {
      const float* xj = x + static_cast<size_t>(j0 + p) * c.dim;
      for (int32_t d = 0; d < c.dim; ++d)
        xt[static_cast<size_t>(d) * kEncodeLanes + p] = xj[d] - c.mean[d];
    }
    for (int32_t i = 0; i < c.n_coded;) {
      const int32_t tile = c.n_coded - i >= 4 ? 4 : 1;
      if (tile == 4) {
        ProjectTile<4>(c, xt.data(), i, s);
      } else {
        ProjectTile<1>(c, xt.data(), i, s);
      }
      for (int32_t k = 0; k < tile; ++k, ++i) {
        // Midrise levels (q + 1/2 - L/2) * step, q in [0, L).
        const int32_t levels = 1 << c.bits[i];
        const float half = 0.5f * static_cast<float>(levels), top = static_cast<float>(levels - 1);
        uint8_t* out = codes + static_cast<size_t>(i) * n + j0;
        for (int32_t p = 0; p < m; ++p) {
          const float q = std::floor(s[k][p] / c.step[i] + half);
          out[p] = static_cast<uint8_t>(std::clamp(q, 0.0f, top));
        }
      }
    }
  }
}

namespace {

// x[p] = mean + sum_i coef[p][i] * u_i for P positions at once, dims [d0, d0 + W): each component
// row is loaded once for the P positions, and the P * W / 16 accumulators (16 zmm for 4 x 64)
// keep enough FMAs in flight to hide their latency. coef is [P][n_coded]; W a multiple of 8.
template <int32_t P, int32_t W>
void ReconstructTile(const HeadCode& c, const float* coef, int32_t d0, float* x) {
  float a[P][W];
  for (int32_t p = 0; p < P; ++p)
    for (int32_t t = 0; t < W; ++t) a[p][t] = c.mean[d0 + t];
  const float* u = c.components.data() + d0;
  for (int32_t i = 0; i < c.n_coded; ++i, u += c.dim) {
    for (int32_t p = 0; p < P; ++p) {
      const float cp = coef[static_cast<size_t>(p) * c.n_coded + i];
      for (int32_t t = 0; t < W; ++t) a[p][t] += cp * u[t];
    }
  }
  for (int32_t p = 0; p < P; ++p)
    for (int32_t t = 0; t < W; ++t) x[static_cast<size_t>(p) * c.dim + d0 + t] = a[p][t];
}

// Positions [j, j + P) of x from their coefficients, every dim.
template <int32_t P>
void ReconstructPositions(const HeadCode& c, const float* coef, float* x) {
  int32_t d0 = 0;
  for (; d0 + 64 <= c.dim; d0 += 64) ReconstructTile<P, 64>(c, coef, d0, x);
  for (; d0 + 16 <= c.dim; d0 += 16) ReconstructTile<P, 16>(c, coef, d0, x);
  for (; d0 < c.dim; ++d0) {  // a head size that is not a multiple of 16
    for (int32_t p = 0; p < P; ++p) {
      float a = c.mean[d0];
      for (int32_t i = 0; i < c.n_coded; ++i)
        a += coef[static_cast<size_t>(p) * c.n_coded + i] *
             c.components[static_cast<size_t>(i) * c.dim + d0];
      x[static_cast<size_t>(p) * c.dim + d0] = a;
    }
  }
}

}  // namespace

void DecodeHeadVectors(const HeadCode& c, const uint8_t* codes, int32_t n, float* x) {
  constexpr int32_t kTile = 4;
  thread_local std::vector<float> coef;  // [kTile][n_coded]
  coef.resize(kTile * static_cast<size_t>(c.n_coded));
  for (int32_t j = 0; j < n; j += kTile) {
    const int32_t m = std::min(kTile, n - j);
    for (int32_t p = 0; p < m; ++p) {
      for (int32_t i = 0; i < c.n_coded; ++i) {
        const float half = 0.5f * static_cast<float>((1 << c.bits[i]) - 1);
        coef[static_cast<size_t>(p) * c.n_coded + i] =
            (static_cast<float>(codes[static_cast<size_t>(i) * n + j + p]) - half) * c.step[i];
      }
    }
    float* xj = x + static_cast<size_t>(j) * c.dim;
    if (m == kTile) {
      ReconstructPositions<kTile>(c, coef.data(), xj);
    } else {
      for (int32_t p = 0; p < m; ++p)
        ReconstructPositions<1>(c, coef.data() + static_cast<size_t>(p) * c.n_coded,
                                xj + static_cast<size_t>(p) * c.dim);
    }
  }
}

void PackCodes(const HeadCode& c, const uint8_t* codes, int32_t n, std::vector<uint8_t>* out) {
  uint64_t acc = 0;
  int32_t filled = 0;
  for (int32_t i = 0; i < c.n_coded; ++i) {
    const int32_t b = c.bits[i];
    for (int32_t j = 0; j < n; ++j) {
      acc |= static_cast<uint64_t>(codes[static_cast<size_t>(i) * n + j]) << filled;
      filled += b;
      while (filled >= 8) {
        out->push_back(static_cast<uint8_t>(acc));
        acc >>= 8;
        filled -= 8;
      }
    }
  }
  if (filled > 0) out->push_back(static_cast<uint8_t>(acc));
}

namespace {

// 8 codes of b bits from the low 8 * b bits of w, one per byte.
inline uint64_t SpreadCodes(uint64_t w, int32_t b) {
  const uint64_t mask = 0x0101010101010101ull * ((1u << b) - 1);
#ifdef __BMI2__
  return _pdep_u64(w, mask);
#else
  uint64_t out = 0;
  for (int32_t k = 0; k < 8; ++k) out |= ((w >> (k * b)) & ((1u << b) - 1)) << (8 * k);
  return out & mask;
#endif
}

}  // namespace

bool UnpackCodes(const HeadCode& c, std::span<const uint8_t> in, int32_t n, uint8_t* codes,
                 size_t* used) {
  const size_t need = (static_cast<size_t>(c.total_bits()) * n + 7) / 8;
  if (in.size() < need) return false;
  if (n % 8 == 0) {
    // Whole bytes per 8 codes (b of them): each group of 8 starts on a byte boundary.
    const uint8_t* at = in.data();
    const uint8_t* const end = in.data() + in.size();
    for (int32_t i = 0; i < c.n_coded; ++i) {
      const int32_t b = c.bits[i];
      uint8_t* out = codes + static_cast<size_t>(i) * n;
      for (int32_t j = 0; j < n; j += 8, at += b) {
        // Little-endian, the packer's order. A whole word where the input has one (its bytes
        // past the b read are ignored by SpreadCodes): a b-byte copy would stall the load.
        uint64_t w = 0;
        if (end - at >= 8) {
          std::memcpy(&w, at, 8);
          if (b < 8) w &= (uint64_t{1} << (8 * b)) - 1;
        } else {
          std::memcpy(&w, at, static_cast<size_t>(b));
        }
        const uint64_t spread = SpreadCodes(w, b);
        std::memcpy(out + j, &spread, 8);
      }
    }
    *used = need;
    return true;
  }
  uint64_t acc = 0;
  int32_t filled = 0;
  size_t at = 0;
  for (int32_t i = 0; i < c.n_coded; ++i) {
    const int32_t b = c.bits[i];
    for (int32_t j = 0; j < n; ++j) {
      while (filled < b) {
        acc |= static_cast<uint64_t>(in[at++]) << filled;
        filled += 8;
      }
      codes[static_cast<size_t>(i) * n + j] = static_cast<uint8_t>(acc & ((1u << b) - 1));
      acc >>= b;
      filled -= b;
    }
  }
  *used = need;
  return true;
}

}  // namespace kvs
