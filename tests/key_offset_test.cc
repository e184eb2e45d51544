// Keys stored less their RoPE-turned offset (KvLayerView::k_offset): what is stored, and that
// attention adds the offset's part of every score back.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/attention.h"
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
  std::vector<int32_t> ids;
  KvLayerView view;

  Layer(KvType k_type, int32_t hd, const RopeParams& rope, const float* offset,
        bool follow_rope = true) {
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
      table.resize(static_cast<size_t>(n_blocks) * rope.n_rot * kKvBlockTokens);
      FillRopeTable(rope, 0, n_blocks, table.data());
      view.k_offset = offsets.data();
      view.k_offset_follows_rope = follow_rope;
      view.rope_table = table.data();
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

// Keys with a large common part before RoPE (as trained models' keys have), turned by RoPE.
std::vector<float> RopedKeys(int32_t hd, const RopeParams& rope, const std::vector<float>& mean) {
  std::vector<float> keys =
      testing::GaussianVector(static_cast<size_t>(kPositions) * kHeads * hd, 7);
  std::vector<float> cos_sin(rope.n_rot);
  for (int32_t p = 0; p < kPositions; ++p) {
    RopeAngles(p, rope, cos_sin.data());
    for (int32_t h = 0; h < kHeads; ++h) {
      float* key = keys.data() + (static_cast<size_t>(p) * kHeads + h) * hd;
      for (int32_t d = 0; d < hd; ++d) key[d] += mean[h * hd + d];
      ApplyRope(key, cos_sin.data(), rope.n_rot, rope.neox);
    }
  }
  return keys;
}

// Largest difference between attention over two layers (each by Attend, or by AttendReference
// where its flag says), every head, queries that see 1..kPositions keys.
double MaxDifference(const Layer& a, bool reference_a, const Layer& b, bool reference_b) {
  const int32_t hd = a.view.head_dim_k;
  const AttentionShape shape{hd, hd, 1.0f / std::sqrt(static_cast<float>(hd))};
  const std::vector<int32_t> n_keys = {1, 9, 16, 17, 40, 63, kPositions};
  const int n = static_cast<int>(n_keys.size());
  const std::vector<float> q = testing::GaussianVector(static_cast<size_t>(n) * hd, 11, 0.5f);
  std::vector<const float*> qp(n);
  for (int i = 0; i < n; ++i) qp[i] = q.data() + static_cast<size_t>(i) * hd;
  double worst = 0;
  for (int32_t h = 0; h < kHeads; ++h) {
    std::vector<float> out_a(static_cast<size_t>(n) * hd), out_b(out_a.size());
    std::vector<float*> pa(n), pb(n);
    for (int i = 0; i < n; ++i) {
      pa[i] = out_a.data() + static_cast<size_t>(i) * hd;
      pb[i] = out_b.data() + static_cast<size_t>(i) * hd;
    }
    (reference_a ? &AttendReference : &Attend)(shape, a.view.Head(h, a.ids.data()), qp.data(),
                                               n_keys.data(), n, pa.data());
    (reference_b ? &AttendReference : &Attend)(shape, b.view.Head(h, b.ids.data()), qp.data(),
                                               n_keys.data(), n, pb.data());
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

}  // namespace
}  // namespace kvs
