#include "kernels/kv_transform.h"

#include <algorithm>
#include <cmath>
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

void EncodeHeadVectors(const HeadCode& c, const float* x, int32_t n, uint8_t* codes) {
  thread_local std::vector<float> centred;
  centred.resize(c.dim);
  for (int32_t j = 0; j < n; ++j) {
    const float* xj = x + static_cast<size_t>(j) * c.dim;
    for (int32_t d = 0; d < c.dim; ++d) centred[d] = xj[d] - c.mean[d];
    for (int32_t i = 0; i < c.n_coded; ++i) {
      const float* u = c.components.data() + static_cast<size_t>(i) * c.dim;
      float s = 0.0f;
      for (int32_t d = 0; d < c.dim; ++d) s += u[d] * centred[d];
      // Midrise levels (q + 1/2 - L/2) * step, q in [0, L).
      const int32_t levels = 1 << c.bits[i];
      const float q = std::floor(s / c.step[i] + 0.5f * static_cast<float>(levels));
      codes[static_cast<size_t>(i) * n + j] =
          static_cast<uint8_t>(std::clamp(q, 0.0f, static_cast<float>(levels - 1)));
    }
  }
}

namespace {

// x[j] = mean + sum_i coef[j][i] * u_i for positions j0, j0 + 1 (two at once: the component rows
// are loaded once for both), dims [d0, d0 + W): 2 * W / 8 independent accumulators, enough
// FMAs in flight to hide their latency. W a multiple of 8.
template <int32_t W>
void ReconstructPair(const HeadCode& c, const float* coef0, const float* coef1, int32_t d0,
                     float* x0, float* x1) {
  float a0[W], a1[W];
  for (int32_t t = 0; t < W; ++t) a0[t] = a1[t] = c.mean[d0 + t];
  const float* u = c.components.data() + d0;
  for (int32_t i = 0; i < c.n_coded; ++i, u += c.dim) {
    const float c0 = coef0[i], c1 = coef1[i];
    for (int32_t t = 0; t < W; ++t) {
      a0[t] += c0 * u[t];
      a1[t] += c1 * u[t];
    }
  }
  for (int32_t t = 0; t < W; ++t) {
    x0[d0 + t] = a0[t];
    if (x1 != nullptr) x1[d0 + t] = a1[t];
  }
}

}  // namespace

void DecodeHeadVectors(const HeadCode& c, const uint8_t* codes, int32_t n, float* x) {
  thread_local std::vector<float> coef;  // [2][n_coded]
  coef.resize(2 * static_cast<size_t>(c.n_coded));
  float* c0 = coef.data();
  float* c1 = coef.data() + c.n_coded;
  for (int32_t j = 0; j < n; j += 2) {
    const bool pair = j + 1 < n;
    for (int32_t i = 0; i < c.n_coded; ++i) {
      const float half = 0.5f * static_cast<float>((1 << c.bits[i]) - 1);
      c0[i] = (static_cast<float>(codes[static_cast<size_t>(i) * n + j]) - half) * c.step[i];
      c1[i] =
          pair ? (static_cast<float>(codes[static_cast<size_t>(i) * n + j + 1]) - half) * c.step[i]
               : 0.0f;
    }
    float* x0 = x + static_cast<size_t>(j) * c.dim;
    float* x1 = pair ? x0 + c.dim : nullptr;
    int32_t d0 = 0;
    for (; d0 + 32 <= c.dim; d0 += 32) ReconstructPair<32>(c, c0, c1, d0, x0, x1);
    for (; d0 + 8 <= c.dim; d0 += 8) ReconstructPair<8>(c, c0, c1, d0, x0, x1);
    for (; d0 < c.dim; ++d0) {  // a head size that is not a multiple of 8
      float a0 = c.mean[d0], a1 = c.mean[d0];
      for (int32_t i = 0; i < c.n_coded; ++i) {
        a0 += c0[i] * c.components[static_cast<size_t>(i) * c.dim + d0];
        a1 += c1[i] * c.components[static_cast<size_t>(i) * c.dim + d0];
      }
      x0[d0] = a0;
      if (x1 != nullptr) x1[d0] = a1;
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

bool UnpackCodes(const HeadCode& c, std::span<const uint8_t> in, int32_t n, uint8_t* codes,
                 size_t* used) {
  const size_t need = (static_cast<size_t>(c.total_bits()) * n + 7) / 8;
  if (in.size() < need) return false;
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
