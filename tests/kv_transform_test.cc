// The transform codec's math (kernels/kv_transform.h) against plain loops: the PCA finds the
// variances it was given, the bit allocation is the optimal one (a brute-force search agrees),
// coding and decoding match their scalar twins, packing round-trips; and ReadKv reads back what
// WriteKv stored, for every KV type and key coding.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/kv_layer.h"
#include "kernels/kv_quant.h"
#include "kernels/kv_transform.h"
#include "kernels/ops.h"
#include "tensor/dtype.h"

namespace kvs {
namespace {

// n vectors of dim with independent coordinates of standard deviation sd[d] along a random
// orthonormal basis (Gram-Schmidt of Gaussian vectors), plus a mean of 3.
std::vector<float> Correlated(int32_t n, int32_t dim, const std::vector<float>& sd,
                              std::vector<float>* basis, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  basis->assign(static_cast<size_t>(dim) * dim, 0.0f);
  for (int32_t i = 0; i < dim; ++i) {
    float* b = basis->data() + static_cast<size_t>(i) * dim;
    for (int32_t d = 0; d < dim; ++d) b[d] = g(rng);
    for (int32_t k = 0; k < i; ++k) {
      const float* c = basis->data() + static_cast<size_t>(k) * dim;
      const float dot = std::inner_product(b, b + dim, c, 0.0f);
      for (int32_t d = 0; d < dim; ++d) b[d] -= dot * c[d];
    }
    const float norm = std::sqrt(std::inner_product(b, b + dim, b, 0.0f));
    for (int32_t d = 0; d < dim; ++d) b[d] /= norm;
  }
  std::vector<float> x(static_cast<size_t>(n) * dim, 3.0f);
  for (int32_t j = 0; j < n; ++j) {
    for (int32_t i = 0; i < dim; ++i) {
      const float c = g(rng) * sd[i];
      for (int32_t d = 0; d < dim; ++d)
        x[static_cast<size_t>(j) * dim + d] += c * (*basis)[i * dim + d];
    }
  }
  return x;
}

TEST(KvTransform, PcaFindsTheVariancesAndDirections) {
  constexpr int32_t kDim = 16, kN = 20000;
  std::vector<float> sd(kDim);
  for (int32_t i = 0; i < kDim; ++i) sd[i] = std::exp2(-0.4f * i);
  std::vector<float> basis;
  const std::vector<float> x = Correlated(kN, kDim, sd, &basis, 1);
  const HeadTransform t = FitHeadTransform(x.data(), kN, kDim, kDim);
  ASSERT_EQ(t.dim, kDim);
  for (int32_t d = 0; d < kDim; ++d) EXPECT_NEAR(t.mean[d], 3.0f, 0.03f);
  for (int32_t i = 0; i < kDim; ++i) {
    EXPECT_NEAR(t.variance[i], sd[i] * sd[i], 0.05 * sd[i] * sd[i]) << "component " << i;
    if (i > 0) {
      EXPECT_LE(t.variance[i], t.variance[i - 1]);
    }
  }
  // The leading directions are the generating ones (up to sign).
  for (int32_t i = 0; i < 4; ++i) {
    const float dot =
        std::inner_product(t.components.begin() + i * kDim, t.components.begin() + (i + 1) * kDim,
                           basis.begin() + i * kDim, 0.0f);
    EXPECT_GT(std::fabs(dot), 0.99f) << "component " << i;
  }
}

// The least total error of any allocation of exactly `budget` bits (<= 8 each), by brute force.
double BestError(const std::vector<float>& var, int32_t budget, size_t i = 0) {
  if (i == var.size()) return budget == 0 ? 0.0 : 1e300;
  double best = 1e300;
  for (int32_t b = 0; b <= std::min(budget, kMaxTransformBits); ++b) {
    best = std::min(best, var[i] * UniformQuantizerError(b) + BestError(var, budget - b, i + 1));
  }
  return best;
}

TEST(KvTransform, BitAllocationIsOptimalAndSkipsSmallComponents) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-6.0f, 2.0f);
  for (int trial = 0; trial < 20; ++trial) {
    std::vector<float> var(5);
    for (float& v : var) v = std::exp2(u(rng));
    std::sort(var.rbegin(), var.rend());
    for (double bpe : {0.4, 1.0, 2.0, 3.2}) {
      const std::vector<uint8_t> bits = AllocateBits(var, bpe);
      const int32_t budget = static_cast<int32_t>(std::llround(bpe * 5));
      EXPECT_EQ(std::accumulate(bits.begin(), bits.end(), 0), budget);
      double err = 0;
      for (size_t i = 0; i < var.size(); ++i) err += var[i] * UniformQuantizerError(bits[i]);
      EXPECT_NEAR(err, BestError(var, budget), 1e-9 * (1 + err)) << "trial " << trial;
      for (size_t i = 1; i < bits.size(); ++i) EXPECT_LE(bits[i], bits[i - 1]);
    }
  }
  // Components without variance get nothing, even with budget left over.
  const std::vector<uint8_t> bits = AllocateBits(std::vector<float>{4.0f, 0.0f, 0.0f}, 8.0);
  EXPECT_EQ(bits, (std::vector<uint8_t>{8, 0, 0}));
}

TEST(KvTransform, CodesMatchTheScalarTwinAndShrinkTheErrorWithBits) {
  for (int32_t dim : {8, 12, 64, 80}) {
    std::vector<float> sd(dim);
    for (int32_t i = 0; i < dim; ++i) sd[i] = std::exp2(-0.15f * i);
    std::vector<float> basis;
    const std::vector<float> x = Correlated(4000, dim, sd, &basis, 2);
    const HeadTransform t = FitHeadTransform(x.data(), 4000, dim, dim);
    double last_err = 1e300;
    for (double bpe : {0.5, 1.0, 2.0, 4.0}) {
      const HeadCode c = MakeHeadCode(t, bpe);
      ASSERT_GT(c.n_coded, 0);
      constexpr int32_t kN = 17;  // not a multiple of the coders' tiles (16 and 4 positions)
      std::vector<uint8_t> codes(static_cast<size_t>(c.n_coded) * kN);
      EncodeHeadVectors(c, x.data(), kN, codes.data());
      std::vector<float> y(static_cast<size_t>(kN) * dim);
      DecodeHeadVectors(c, codes.data(), kN, y.data());
      double err = 0, energy = 0;
      for (int32_t j = 0; j < kN; ++j) {
        const float* xj = x.data() + static_cast<size_t>(j) * dim;
        std::vector<float> centred(dim);
        for (int32_t d = 0; d < dim; ++d) centred[d] = xj[d] - c.mean[d];
        std::vector<double> ref(c.mean.begin(), c.mean.end());
        for (int32_t i = 0; i < c.n_coded; ++i) {
          const float* ui = c.components.data() + static_cast<size_t>(i) * dim;
          double s = 0;
          for (int32_t d = 0; d < dim; ++d) s += ui[d] * centred[d];
          const int32_t levels = 1 << c.bits[i];
          const int32_t q = std::clamp(
              static_cast<int32_t>(std::floor(s / c.step[i] + levels / 2.0)), 0, levels - 1);
          // The encoder's float arithmetic may land a hair on the other side of a step.
          EXPECT_LE(std::abs(q - codes[static_cast<size_t>(i) * kN + j]), 1);
          const double coef =
              (codes[static_cast<size_t>(i) * kN + j] - (levels - 1) / 2.0) * c.step[i];
          for (int32_t d = 0; d < dim; ++d) ref[d] += coef * ui[d];
        }
        for (int32_t d = 0; d < dim; ++d) {
          EXPECT_NEAR(y[static_cast<size_t>(j) * dim + d], ref[d], 1e-4 * (1 + std::fabs(ref[d])));
          err += (y[static_cast<size_t>(j) * dim + d] - xj[d]) *
                 (y[static_cast<size_t>(j) * dim + d] - xj[d]);
          energy += centred[d] * centred[d];
        }
      }
      EXPECT_LT(err, last_err) << "dim " << dim << " bits " << bpe;
      last_err = err;
      if (bpe == 4.0) {
        EXPECT_LT(err, 0.02 * energy) << "dim " << dim;
      }
    }
  }
}

// Every code width, for position counts that take UnpackCodes' whole-byte path (multiples of 8:
// a block's 16) and its bit-by-bit one.
TEST(KvTransform, PackingRoundTripsAndRefusesShortInput) {
  HeadCode c;
  c.dim = 9;
  c.bits = {3, 1, 2, 8, 4, 5, 6, 7, 1};
  c.n_coded = static_cast<int32_t>(c.bits.size());
  ASSERT_EQ(c.total_bits(), 37);
  std::mt19937 rng(9);
  for (int32_t n : {5, 8, 16, 24, 13}) {
    SCOPED_TRACE("positions " + std::to_string(n));
    std::vector<uint8_t> codes(static_cast<size_t>(c.n_coded) * n);
    for (int32_t i = 0; i < c.n_coded; ++i) {
      for (int32_t j = 0; j < n; ++j) codes[i * n + j] = rng() % (1u << c.bits[i]);
    }
    std::vector<uint8_t> packed;
    PackCodes(c, codes.data(), n, &packed);
    EXPECT_EQ(packed.size(), (37u * n + 7) / 8);
    packed.push_back(0xff);  // bytes after the codes are not read
    std::vector<uint8_t> back(codes.size());
    size_t used = 0;
    ASSERT_TRUE(UnpackCodes(c, packed, n, back.data(), &used));
    EXPECT_EQ(used, packed.size() - 1);
    EXPECT_EQ(back, codes);
    EXPECT_FALSE(UnpackCodes(c, std::span<const uint8_t>(packed).first(packed.size() - 2), n,
                             back.data(), &used));
  }
}

TEST(KvTransform, HalfConversionsMatchTheirPortableTwins) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float a = F16ToF32(static_cast<uint16_t>(h)),
                b = F16ToF32Portable(static_cast<uint16_t>(h));
    if (std::isnan(b)) {
      EXPECT_TRUE(std::isnan(a));
      continue;
    }
    ASSERT_EQ(std::memcmp(&a, &b, 4), 0) << "half " << h;
    ASSERT_EQ(F32ToF16(b), F32ToF16Portable(b)) << "half " << h;
  }
  std::mt19937 rng(11);
  for (int i = 0; i < 200000; ++i) {
    uint32_t bits = rng();
    float f;
    std::memcpy(&f, &bits, 4);
    if (std::isnan(f)) continue;
    ASSERT_EQ(F32ToF16(f), F32ToF16Portable(f)) << "bits " << bits;
  }
}

// A layer of one kernel block over its own memory, in type t with the coding kind.
struct OneBlockLayer {
  std::vector<uint8_t> k, v;
  std::vector<float> offsets, rope_table;
  std::vector<KeyWhitening> whitening;
  KvLayerView view;
};

OneBlockLayer MakeLayer(KvType t, int32_t heads, int32_t hd, KeyCodingKind kind) {
  OneBlockLayer l;
  KvLayerView& v = l.view;
  v.n_head_kv = heads;
  v.head_dim_k = v.head_dim_v = hd;
  v.k_type = v.v_type = t;
  v.key_coding = kind;
  v.n_rot = hd;
  l.k.assign(v.k_block_stride(), 0);
  l.v.assign(v.v_block_stride(), 0);
  v.k = l.k.data();
  v.v = l.v.data();
  std::mt19937 rng(4);
  std::normal_distribution<float> g(0.0f, 1.0f);
  l.offsets.resize(static_cast<size_t>(heads) * hd);
  for (float& o : l.offsets) o = g(rng);
  v.k_offset = l.offsets.data();
  if (kind == KeyCodingKind::kWhitened) {
    std::vector<float> keys(400 * static_cast<size_t>(hd));
    for (float& k : keys) k = 2.0f * g(rng);
    for (int32_t h = 0; h < heads; ++h)
      l.whitening.push_back(FitKeyWhitening(keys.data(), 400, hd, hd));
    v.k_whitening = l.whitening.data();
  }
  const RopeParams rope{hd, 10000.0f, 1.0f, false, nullptr};
  l.rope_table.resize(static_cast<size_t>(4) * hd * kKvBlockTokens);
  FillRopeTable(rope, 0, 4, l.rope_table.data());
  v.rope_table = l.rope_table.data();
  v.rope_positions = 4 * kKvBlockTokens;
  return l;
}

TEST(KvTransform, ReadKvReadsBackWhatWriteKvStored) {
  for (KvType t : kAllKvTypes) {
    for (int32_t hd : {8, 64}) {
      const KeyCodingKind kind = KeyCodingKindFor(t, hd);
      OneBlockLayer l = MakeLayer(t, 2, hd, kind);
      std::mt19937 rng(8);
      std::normal_distribution<float> g(0.0f, 1.0f);
      double err = 0, energy = 0;
      for (int32_t slot = 0; slot < kKvBlockTokens; ++slot) {
        const int32_t pos = 17 + slot;  // positions are not slots
        std::vector<float> k(2 * hd), v(2 * hd), rk(2 * hd), rv(2 * hd);
        for (float& x : k) x = g(rng);
        for (float& x : v) x = g(rng);
        WriteKv(l.view, slot, pos, k.data(), v.data());
        ReadKv(l.view, slot, pos, rk.data(), rv.data());
        for (int32_t i = 0; i < 2 * hd; ++i) {
          if (t == KvType::kF32) {
            ASSERT_EQ(rk[i], k[i]);
            ASSERT_EQ(rv[i], v[i]);
          }
          err += (rk[i] - k[i]) * (rk[i] - k[i]) + (rv[i] - v[i]) * (rv[i] - v[i]);
          energy += k[i] * k[i] + v[i] * v[i];
        }
      }
      // Each type's own precision: 3 bits leave the most (a relative error of about 0.2).
      const double bound = KvCodeBits(t) >= 16 ? 1e-5 : KvCodeBits(t) == 8 ? 2e-3 : 0.08;
      EXPECT_LT(err / energy, bound)
          << KvTypeName(t) << " head_dim " << hd << " " << KeyCodingKindName(kind);
    }
  }
}

}  // namespace
}  // namespace kvs
