// Keys stored less their RoPE-turned offset (KvLayerView::k_offset): what is stored, and that
// attention adds the offset's part of every score back. Keys of small heads stored whitened
// (KvLayerView::k_whitening): the fit, and attention over them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/key_whitening.h"
#include "kernels/kv_layer.h"
#include "kernels/kv_quant.h"
#include "kernels/ops.h"
#include "testing/random.h"

namespace kvs {
namespace {

constexpr int32_t kHeads = 2, kPositions = 70;

// One layer of n_blocks kernel blocks holding a sequence at blocks 0, 1, ... in order, written
// through WriteKv, with or without key offsets.
struct Layer {
  std::vector<uint8_t> k, v;
  std::vector<float> offsets, table;
  std::vector<KeyWhitening> whitening;
  std::vector<int32_t> ids;
  KvLayerView view;

  Layer(KvType k_type, int32_t hd, const RopeParams& rope, const float* offset,
        bool follow_rope = true, const std::vector<KeyWhitening>* whitened = nullptr) {
    const int32_t n_blocks = (kPositions + kKvBlockTokens - 1) / kKvBlockTokens;
    view.n_head_kv = kHeads;
    view.head_dim_k = view.head_dim_v = hd;
    view.k_type = k_type;
    view.v_type = KvType::kF32;
    k.resize(n_blocks * view.k_block_stride());
    v.resize(n_blocks * view.v_block_stride());
    view.k = k.data();
    view.v = v.data();
    for (int32_t b = 0; b < n_blocks; ++b) ids.push_back(b);
    if (offset != nullptr) {
      offsets.assign(offset, offset + kHeads * hd);
      view.k_offset = offsets.data();
      view.key_coding = follow_rope ? KeyCodingKind::kRopeOffset : KeyCodingKind::kConstantOffset;
    }
    if (whitened != nullptr) {
      whitening = *whitened;
      view.k_whitening = whitening.data();
      view.key_coding = KeyCodingKind::kWhitened;
    }
    if (view.NeedsRopeTable()) {
      table.resize(static_cast<size_t>(n_blocks) * rope.n_rot * kKvBlockTokens);
      FillRopeTable(rope, 0, n_blocks, table.data());
      view.rope_table = table.data();
      view.rope_positions = n_blocks * kKvBlockTokens;
      view.n_rot = rope.n_rot;
      view.rope_neox = rope.neox;
    }
  }
  void Write(const std::vector<float>& keys, const std::vector<float>& values) {
    const size_t row = static_cast<size_t>(kHeads) * view.head_dim_k;
    for (int32_t p = 0; p < kPositions; ++p) {
      WriteKv(view, p, p, keys.data() + p * row, values.data() + p * row);
    }
  }
};

// Keys before RoPE [n][kHeads][hd]: each head's mean plus, where mix is given ([kHeads][hd][hd]),
// mix times a unit Gaussian, else the Gaussian itself.
std::vector<float> PreRopeKeys(int32_t n, int32_t hd, const std::vector<float>& mean,
                               const std::vector<float>* mix = nullptr, uint32_t seed = 7) {
  const std::vector<float> z = testing::GaussianVector(static_cast<size_t>(n) * kHeads * hd, seed);
  std::vector<float> keys(z.size());
  for (size_t row = 0; row < static_cast<size_t>(n) * kHeads; ++row) {
    const int32_t h = static_cast<int32_t>(row % kHeads);
    for (int32_t d = 0; d < hd; ++d) {
      double x = mix == nullptr ? z[row * hd + d] : 0.0;
      for (int32_t j = 0; mix != nullptr && j < hd; ++j) {
        x += (*mix)[(static_cast<size_t>(h) * hd + d) * hd + j] * z[row * hd + j];
      }
      keys[row * hd + d] = static_cast<float>(x) + mean[h * hd + d];
    }
  }
  return keys;
}

// The keys of kPositions tokens, turned by RoPE to their positions.
std::vector<float> RopedKeys(int32_t hd, const RopeParams& rope, const std::vector<float>& mean,
                             const std::vector<float>* mix = nullptr) {
  std::vector<float> keys = PreRopeKeys(kPositions, hd, mean, mix);
  std::vector<float> cos_sin(rope.n_rot);
  for (int32_t p = 0; p < kPositions; ++p) {
    RopeAngles(p, rope, cos_sin.data());
    for (int32_t h = 0; h < kHeads; ++h) {
      ApplyRope(keys.data() + (static_cast<size_t>(p) * kHeads + h) * hd, cos_sin.data(),
                rope.n_rot, rope.neox);
    }
  }
  return keys;
}

// The queries MaxDifference asks: they see these numbers of keys.
const std::vector<int32_t> kQueryKeys = {1, 9, 16, 17, 40, 63, kPositions};

// Largest difference between attention over two layers (each by Attend, or by AttendReference
// where its flag says), every head, queries that see 1..kPositions keys: Gaussian ones, or
// queries [kHeads][kQueryKeys.size()][hd] where given.
double MaxDifference(const Layer& a, bool reference_a, const Layer& b, bool reference_b,
                     const std::vector<float>* queries = nullptr) {
  const int32_t hd = a.view.head_dim_k;
  const AttentionShape shape{hd, hd, 1.0f / std::sqrt(static_cast<float>(hd))};
  const std::vector<int32_t>& n_keys = kQueryKeys;
  const int n = static_cast<int>(n_keys.size());
  const std::vector<float> gaussian =
      testing::GaussianVector(static_cast<size_t>(n) * hd, 11, 0.5f);
  double worst = 0;
  for (int32_t h = 0; h < kHeads; ++h) {
    const float* q =
        queries == nullptr ? gaussian.data() : queries->data() + static_cast<size_t>(h) * n * hd;
    std::vector<const float*> qp(n);
    for (int i = 0; i < n; ++i) qp[i] = q + static_cast<size_t>(i) * hd;
    std::vector<float> out_a(static_cast<size_t>(n) * hd), out_b(out_a.size());
    std::vector<float*> pa(n), pb(n);
    for (int i = 0; i < n; ++i) {
      pa[i] = out_a.data() + static_cast<size_t>(i) * hd;
      pb[i] = out_b.data() + static_cast<size_t>(i) * hd;
    }
    (reference_a ? &AttendReference : &Attend)(shape, a.view.Head(h, a.ids.data()), qp.data(),
                                               n_keys.data(), n, pa.data(), nullptr);
    (reference_b ? &AttendReference : &Attend)(shape, b.view.Head(h, b.ids.data()), qp.data(),
                                               n_keys.data(), n, pb.data(), nullptr);
    for (size_t i = 0; i < out_a.size(); ++i) {
      worst = std::max(worst, std::fabs(static_cast<double>(out_a[i]) - out_b[i]));
    }
  }
  return worst;
}

struct RopeCase {
  int32_t hd;
  RopeParams rope;
};

std::vector<RopeCase> Cases() {
  return {{8, RopeParams{8, 10000.f, 1.f, false, nullptr}},
          {64, RopeParams{64, 10000.f, 1.f, false, nullptr}},
          {64, RopeParams{32, 1000000.f, 1.f, true, nullptr}}};  // neox, partial rotary
}

// f32 keys: the cache holds key - R(p)·m, and attention over it equals attention over the keys.
TEST(KeyOffsets, StoredLessTheTurnedMeanAndAttentionUnchanged) {
  for (const RopeCase& c : Cases()) {
    SCOPED_TRACE("head_dim " + std::to_string(c.hd) + " n_rot " + std::to_string(c.rope.n_rot));
    const std::vector<float> mean = testing::GaussianVector(kHeads * c.hd, 3, 6.0f);
    const std::vector<float> keys = RopedKeys(c.hd, c.rope, mean);
    const std::vector<float> values =
        testing::GaussianVector(static_cast<size_t>(kPositions) * kHeads * c.hd, 5);
    Layer plain(KvType::kF32, c.hd, c.rope, nullptr),
        shifted(KvType::kF32, c.hd, c.rope, mean.data());
    plain.Write(keys, values);
    shifted.Write(keys, values);
    std::vector<float> cos_sin(c.rope.n_rot), offset(c.hd);
    for (int32_t p : {0, 5, 16, 33, kPositions - 1}) {
      RopeAngles(p, c.rope, cos_sin.data());
      for (int32_t h = 0; h < kHeads; ++h) {
        std::copy(mean.begin() + h * c.hd, mean.begin() + (h + 1) * c.hd, offset.begin());
        ApplyRope(offset.data(), cos_sin.data(), c.rope.n_rot, c.rope.neox);
        const KvHeadView view = shifted.view.Head(h, shifted.ids.data());
        for (int32_t d = 0; d < c.hd; ++d) {
          const float stored = LoadKey(KvType::kF32, KeyBlock(view, p / kKvBlockTokens), c.hd, d,
                                       p % kKvBlockTokens);
          ASSERT_NEAR(stored, keys[(static_cast<size_t>(p) * kHeads + h) * c.hd + d] - offset[d],
                      1e-4)
              << "pos " << p << " head " << h << " dim " << d;
        }
      }
    }
    EXPECT_LT(MaxDifference(plain, false, shifted, false), 2e-4);  // kernel
    EXPECT_LT(MaxDifference(plain, true, shifted, true), 2e-5);    // scalar twin
    // A constant offset is stored as it is and needs nothing back.
    Layer constant(KvType::kF32, c.hd, c.rope, mean.data(), /*follow_rope=*/false);
    constant.Write(keys, values);
    const KvHeadView view = constant.view.Head(1, constant.ids.data());
    EXPECT_EQ(view.k_offset, nullptr);
    EXPECT_NEAR(LoadKey(KvType::kF32, KeyBlock(view, 2), c.hd, 3, 5),
                keys[(static_cast<size_t>(2 * kKvBlockTokens + 5) * kHeads + 1) * c.hd + 3] -
                    mean[c.hd + 3],
                1e-5);
    EXPECT_LT(MaxDifference(plain, false, constant, false), 2e-4);
  }
}

// Quantized keys with a large common part: turning the offset with each key's position leaves
// the codes only the part that differs, so attention errs far less than without offsets.
TEST(KeyOffsets, QuantizedKeysErrLessWithTheOffset) {
  for (const RopeCase& c : Cases()) {
    for (KvType t : {KvType::kTurbo3, KvType::kQ4_0, KvType::kQ8_0}) {
      SCOPED_TRACE(std::string(KvTypeName(t)) + " head_dim " + std::to_string(c.hd));
      const std::vector<float> mean = testing::GaussianVector(kHeads * c.hd, 3, 6.0f);
      const std::vector<float> keys = RopedKeys(c.hd, c.rope, mean);
      const std::vector<float> values =
          testing::GaussianVector(static_cast<size_t>(kPositions) * kHeads * c.hd, 5);
      Layer exact(KvType::kF32, c.hd, c.rope, nullptr), plain(t, c.hd, c.rope, nullptr),
          shifted(t, c.hd, c.rope, mean.data());
      for (Layer* layer : {&exact, &plain, &shifted}) layer->Write(keys, values);
      const double err_plain = MaxDifference(exact, false, plain, false);
      const double err_shifted = MaxDifference(exact, false, shifted, false);
      EXPECT_LT(err_shifted, 0.5 * err_plain) << err_shifted << " vs " << err_plain;
      // The kernel's per-block offset scores against the scalar twin's, same stored codes.
      EXPECT_LT(MaxDifference(shifted, false, shifted, true), 1e-4);
    }
  }
}

// Per head an orthonormal basis [kHeads][hd][hd] (Gram-Schmidt of Gaussian columns) and the
// key spread along its directions, falling off by 1.5x each: keys with a few dominant
// directions not aligned with the dims, as trained models' keys have. mix = basis * spread.
struct KeyShape {
  std::vector<float> basis, spread, mix;
};
KeyShape AnisotropicKeys(int32_t hd) {
  KeyShape ks;
  ks.basis = testing::GaussianVector(static_cast<size_t>(kHeads) * hd * hd, 13);
  for (int32_t h = 0; h < kHeads; ++h) {
    float* m = ks.basis.data() + static_cast<size_t>(h) * hd * hd;  // column j: m[d * hd + j]
    for (int32_t j = 0; j < hd; ++j) {
      for (int32_t i = 0; i < j; ++i) {
        double dot = 0.0;
        for (int32_t d = 0; d < hd; ++d) dot += m[d * hd + i] * m[d * hd + j];
        for (int32_t d = 0; d < hd; ++d) m[d * hd + j] -= static_cast<float>(dot) * m[d * hd + i];
      }
      double norm = 0.0;
      for (int32_t d = 0; d < hd; ++d) norm += m[d * hd + j] * m[d * hd + j];
      for (int32_t d = 0; d < hd; ++d) m[d * hd + j] /= static_cast<float>(std::sqrt(norm));
    }
  }
  for (int32_t j = 0; j < hd; ++j) ks.spread.push_back(2.0f * std::pow(1.5f, -float(j)));
  ks.mix = ks.basis;
  for (size_t i = 0; i < ks.mix.size(); ++i) ks.mix[i] *= ks.spread[i % hd];
  return ks;
}

// Queries that read the keys' weak directions more than their dominant ones (before RoPE
// basis * z / spread, then turned to their own positions), as a trained model's do: the
// dominant directions carry what all keys share.
std::vector<float> WeakDirectionQueries(const KeyShape& ks, int32_t hd, const RopeParams& rope) {
  const int n = static_cast<int>(kQueryKeys.size());
  const std::vector<float> z = testing::GaussianVector(static_cast<size_t>(kHeads) * n * hd, 17);
  std::vector<float> q(z.size(), 0.0f), cos_sin(rope.n_rot);
  for (int32_t h = 0; h < kHeads; ++h) {
    const float* basis = ks.basis.data() + static_cast<size_t>(h) * hd * hd;
    for (int i = 0; i < n; ++i) {
      float* qi = q.data() + (static_cast<size_t>(h) * n + i) * hd;
      const float* zi = z.data() + (static_cast<size_t>(h) * n + i) * hd;
      for (int32_t d = 0; d < hd; ++d) {
        for (int32_t j = 0; j < hd; ++j) qi[d] += 0.2f * basis[d * hd + j] * zi[j] / ks.spread[j];
      }
      RopeAngles(kQueryKeys[i] - 1, rope, cos_sin.data());
      ApplyRope(qi, cos_sin.data(), rope.n_rot, rope.neox);
    }
  }
  return q;
}

// Each head's whitening, fitted on n keys before RoPE [n][kHeads][hd].
std::vector<KeyWhitening> FitWhitening(const std::vector<float>& keys, int32_t n, int32_t hd) {
  std::vector<KeyWhitening> out;
  for (int32_t h = 0; h < kHeads; ++h) {
    out.push_back(FitKeyWhitening(keys.data() + h * hd, n, static_cast<size_t>(kHeads) * hd, hd));
  }
  return out;
}

// The fitted map gives uncorrelated coordinates of at most unit variance (1 for the dominant
// directions; the 1% floor on the eigenvalues shrinks the weakest), and the key comes back
// exactly from its coordinates after the store's rotation.
TEST(KeyWhitening, WhiteCoordinatesAndExactRoundTrip) {
  for (int32_t hd : {8, 16}) {
    SCOPED_TRACE("head_dim " + std::to_string(hd));
    const std::vector<float> mean = testing::GaussianVector(kHeads * hd, 3, 6.0f);
    const KeyShape ks = AnisotropicKeys(hd);
    constexpr int32_t kSamples = 4000;
    const std::vector<float> keys = PreRopeKeys(kSamples, hd, mean, &ks.mix, 21);
    const std::vector<KeyWhitening> fit = FitWhitening(keys, kSamples, hd);
    for (int32_t h = 0; h < kHeads; ++h) {
      std::vector<double> cov(static_cast<size_t>(hd) * hd, 0.0);
      std::vector<float> y(hd), back(hd);
      double worst_round_trip = 0.0;
      for (int32_t i = 0; i < kSamples; ++i) {
        const float* k = keys.data() + (static_cast<size_t>(i) * kHeads + h) * hd;
        WhitenKey(fit[h], hd, k, y.data());
        for (int32_t a = 0; a < hd; ++a) {
          for (int32_t b = 0; b < hd; ++b) cov[a * hd + b] += double(y[a]) * y[b] / kSamples;
        }
        RotateForward(y.data(), hd);  // what StoreKey stores
        UnwhitenKey(fit[h], hd, y.data(), back.data());
        for (int32_t d = 0; d < hd; ++d) {
          worst_round_trip = std::max(worst_round_trip, double(std::fabs(back[d] - k[d])));
        }
      }
      EXPECT_LT(worst_round_trip, 1e-4);
      double max_var = 0.0;
      for (int32_t a = 0; a < hd; ++a) {
        EXPECT_LE(cov[a * hd + a], 1.0 + 1e-3);
        max_var = std::max(max_var, cov[a * hd + a]);
        for (int32_t b = 0; b < a; ++b) EXPECT_NEAR(cov[a * hd + b], 0.0, 1e-3);
      }
      EXPECT_NEAR(max_var, 1.0, 1e-2);
    }
  }
}

// 4- and 3-bit keys with a few dominant directions, queried along their weak ones: stored
// whitened, attention errs less than with the rotation and the RoPE-turned offset (the other
// heads' coding; 0.34-0.64 of its error here), and the kernel's decoded blocks agree with the
// scalar twin. (Queries that read all directions alike gain nothing from whitening: the error
// then follows the total squared error, the same for both codings.)
TEST(KeyWhitening, QuantizedKeysErrLessWhitenedAndKernelMatchesTwin) {
  const RopeCase cases[] = {{8, RopeParams{8, 10000.f, 1.f, false, nullptr}},
                            {16, RopeParams{8, 1000000.f, 1.f, true, nullptr}}};  // partial
  for (const RopeCase& c : cases) {
    const std::vector<float> mean = testing::GaussianVector(kHeads * c.hd, 3, 6.0f);
    const KeyShape ks = AnisotropicKeys(c.hd);
    const std::vector<float> keys = RopedKeys(c.hd, c.rope, mean, &ks.mix);
    const std::vector<float> queries = WeakDirectionQueries(ks, c.hd, c.rope);
    const std::vector<float> values =
        testing::GaussianVector(static_cast<size_t>(kPositions) * kHeads * c.hd, 5);
    // Fitted on other keys of the same kind (as the engine fits on a calibration run).
    const std::vector<KeyWhitening> fit =
        FitWhitening(PreRopeKeys(256, c.hd, mean, &ks.mix, 99), 256, c.hd);
    for (KvType t : {KvType::kTurbo3, KvType::kTurbo4}) {
      SCOPED_TRACE(std::string(KvTypeName(t)) + " head_dim " + std::to_string(c.hd));
      ASSERT_TRUE(KvKeysWhitened(t, c.hd));
      Layer exact(KvType::kF32, c.hd, c.rope, nullptr), shifted(t, c.hd, c.rope, mean.data()),
          whitened(t, c.hd, c.rope, nullptr, true, &fit);
      for (Layer* layer : {&exact, &shifted, &whitened}) layer->Write(keys, values);
      const double err_shifted = MaxDifference(exact, false, shifted, false, &queries);
      const double err_whitened = MaxDifference(exact, false, whitened, false, &queries);
      EXPECT_LT(err_whitened, 0.75 * err_shifted) << err_whitened << " vs " << err_shifted;
      EXPECT_LT(MaxDifference(whitened, false, whitened, true, &queries), 1e-4);
      EXPECT_LT(MaxDifference(whitened, false, whitened, true), 1e-4);
    }
  }
  EXPECT_FALSE(KvKeysWhitened(KvType::kTurbo3, 32));
  EXPECT_FALSE(KvKeysWhitened(KvType::kQ4_0, 8));
}

}  // namespace
}  // namespace kvs
