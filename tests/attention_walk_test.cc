// Adversarial checks of the multi-query walk (up to 32 queries per KV head walk): every query
// count 1..70 (tile remainders, several walks), wildly different key counts inside one walk,
// every KV type, every key coding (plain, constant offset, RoPE offset, whitened), head sizes
// 8..256 and odd ones; outputs against AttendReference, and each query bit-identical alone,
// among its walk, and among a differently ordered walk. Then split-K: keys over several
// partitions, and AttendPartition over many heads + MergePartitions bit-identical to Attend.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/key_whitening.h"
#include "kernels/kv_layer.h"
#include "kernels/kv_quant.h"
#include "kernels/ops.h"
#include "testing/kv_head_pool.h"

namespace kvs {
namespace {

enum class Coding { kPlain, kRopeOffset, kWhitened };

const char* CodingName(Coding c) {
  return c == Coding::kPlain ? "plain" : c == Coding::kRopeOffset ? "rope-offset" : "whitened";
}

// One KV head in a shuffled pool (0xff in unused blocks), keys/values N(0,1).
struct Head {
  int32_t hk, hv;
  std::vector<uint8_t> k_pool, v_pool;
  std::vector<int32_t> ids;
  std::vector<float> offset, table;
  KeyWhitening whitening;
  KvHeadView view;

  Head(int32_t hk_, int32_t hv_, int32_t n_written, uint32_t seed, KvType kt, KvType vt,
       Coding coding)
      : hk(hk_), hv(hv_) {
    const size_t kb = KvHeadBlockBytes(kt, hk), vb = KvHeadBlockBytes(vt, hv);
    std::mt19937 rng(seed);
    ids = testing::ShuffledHeadPool(n_written, kb, vb, rng, &k_pool, &v_pool);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> k(hk), v(hv);
    for (int32_t pos = 0; pos < n_written; ++pos) {
      for (float& x : k) x = dist(rng);
      for (float& x : v) x = dist(rng);
      const size_t block = static_cast<size_t>(ids[pos / kKvBlockTokens]);
      StoreKey(kt, k_pool.data() + block * kb, hk, pos % kKvBlockTokens, k.data());
      StoreValue(vt, v_pool.data() + block * vb, hv, pos % kKvBlockTokens, v.data());
    }
    view = KvHeadView{k_pool.data(), v_pool.data(), kb, vb, ids.data(), kt, vt};
    if (coding != Coding::kPlain) {
      RopeParams rope;
      rope.n_rot = hk % 2 == 0 ? hk : hk - 1;
      rope.neox = (seed & 1) != 0;
      table.resize(ids.size() * rope.n_rot * kKvBlockTokens);
      FillRopeTable(rope, 0, static_cast<int32_t>(ids.size()), table.data());
      view.rope_table = table.data();
      view.n_rot = rope.n_rot;
      view.rope_neox = rope.neox;
    }
    if (coding == Coding::kRopeOffset) {
      offset.resize(hk);
      for (float& x : offset) x = 2.0f * dist(rng);
      view.k_offset = offset.data();
    }
    if (coding == Coding::kWhitened) {
      for (int32_t d = 0; d < hk; ++d) {
        whitening.mean[d] = dist(rng);
        for (int32_t j = 0; j < hk; ++j) {
          whitening.from_coords[d * hk + j] = (d == j ? 1.0f : 0.0f) + 0.2f * dist(rng);
        }
      }
      view.k_whitening = &whitening;
    }
  }
};

struct Out {
  std::vector<float> data;
  std::vector<float*> rows;
  Out(int n, int32_t hv) : data(static_cast<size_t>(n) * hv, -7.0f), rows(n) {
    for (int i = 0; i < n; ++i) rows[i] = data.data() + static_cast<size_t>(i) * hv;
  }
};

// Key counts: a mix of 1, tiny, block edges and large ones, inside [1, max_keys].
std::vector<int32_t> WildKeyCounts(int n, int32_t max_keys, std::mt19937& rng) {
  std::vector<int32_t> n_keys(n);
  const int32_t specials[] = {1, 2, 15, 16, 17, 31, 32, 33, max_keys - 1, max_keys};
  for (int i = 0; i < n; ++i) {
    const uint32_t r = rng() % 4;
    if (r == 0) {
      n_keys[i] = std::clamp(specials[rng() % 10], 1, max_keys);
    } else {
      n_keys[i] = 1 + static_cast<int32_t>(rng() % max_keys);
    }
  }
  return n_keys;
}

void CheckCase(int32_t hk, int32_t hv, KvType kt, KvType vt, Coding coding, int n, int32_t max_keys,
               uint32_t seed, double tolerance) {
  SCOPED_TRACE(std::string(KvTypeName(kt)) + "/" + std::string(KvTypeName(vt)) + " " +
               CodingName(coding) + " hk " + std::to_string(hk) + " hv " + std::to_string(hv) +
               " n " + std::to_string(n) + " keys " + std::to_string(max_keys));
  Head head(hk, hv, max_keys, seed, kt, vt, coding);
  std::mt19937 rng(seed * 7 + 1);
  std::vector<int32_t> n_keys = WildKeyCounts(n, max_keys, rng);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(n) * hk);
  for (float& x : q) x = dist(rng);
  std::vector<const float*> qp(n);
  for (int i = 0; i < n; ++i) qp[i] = q.data() + static_cast<size_t>(i) * hk;
  const AttentionShape shape{hk, hv, 1.0f / std::sqrt(static_cast<float>(hk))};

  Out together(n, hv), reference(n, hv);
  Attend(shape, head.view, qp.data(), n_keys.data(), n, together.rows.data());
  AttendReference(shape, head.view, qp.data(), n_keys.data(), n, reference.rows.data());
  double worst = 0.0;
  for (size_t i = 0; i < together.data.size(); ++i) {
    ASSERT_TRUE(std::isfinite(together.data[i])) << "element " << i;
    worst = std::max(worst, std::fabs(static_cast<double>(together.data[i]) - reference.data[i]));
  }
  EXPECT_LT(worst, tolerance);

  // Each query alone: bit-identical.
  Out alone(1, hv);
  for (int i = 0; i < n; ++i) {
    Attend(shape, head.view, qp.data() + i, n_keys.data() + i, 1, alone.rows.data());
    ASSERT_EQ(std::memcmp(alone.data.data(), together.rows[i], hv * sizeof(float)), 0)
        << "query " << i << " (n_keys " << n_keys[i] << ") differs alone vs among " << n;
  }
  // Reversed order (different tiles, different walk neighbours, different remainders).
  std::vector<const float*> qr(qp.rbegin(), qp.rend());
  std::vector<int32_t> kr(n_keys.rbegin(), n_keys.rend());
  Out reversed(n, hv);
  Attend(shape, head.view, qr.data(), kr.data(), n, reversed.rows.data());
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(std::memcmp(reversed.rows[n - 1 - i], together.rows[i], hv * sizeof(float)), 0)
        << "query " << i << " differs when the walk is reversed";
  }
}

TEST(AttentionWalk, EveryQueryCountOneToSeventyWildKeyCounts) {
  uint32_t seed = 100;
  for (int n = 1; n <= 70; ++n) {
    CheckCase(64, 64, KvType::kF32, KvType::kF32, Coding::kPlain, n, 1000, ++seed, 2e-5);
  }
}

TEST(AttentionWalk, EveryTypeAndCoding) {
  uint32_t seed = 500;
  for (KvType kt : kAllKvTypes) {
    for (KvType vt : {KvType::kF16, KvType::kQ4_0, KvType::kTurbo3, kt}) {
      for (int n : {1, 3, 5, 33, 38, 67}) {
        CheckCase(64, 64, kt, vt, Coding::kPlain, n, 300, ++seed, 1e-4);
        CheckCase(64, 64, kt, vt, Coding::kRopeOffset, n, 300, ++seed, 1e-4);
        // Whitening is only ever applied to 4- and 3-bit keys (KvKeysWhitened).
        if (KvKeysWhitened(kt, 16)) {
          CheckCase(16, 16, kt, vt, Coding::kWhitened, n, 300, ++seed, 1e-4);
          CheckCase(8, 8, kt, vt, Coding::kWhitened, n, 120, ++seed, 1e-4);
        }
      }
    }
  }
}

TEST(AttentionWalk, HeadSizes) {
  uint32_t seed = 900;
  const std::vector<std::pair<int32_t, int32_t>> dims = {
      {8, 8}, {64, 64}, {128, 128}, {256, 256}, {17, 33}, {1, 1}, {3, 513}, {40, 1000}, {96, 24}};
  for (auto [hk, hv] : dims) {
    for (int n : {1, 2, 3, 4, 31, 32, 33, 34, 35, 65, 70}) {
      CheckCase(hk, hv, KvType::kF32, KvType::kF16, Coding::kPlain, n, 200, ++seed, 5e-5);
    }
  }
  // Quantized at sizes the types allow.
  for (KvType t : kAllKvTypes) {
    for (int32_t hd : {8, 24, 40, 72, 256}) {
      if (!ValidateKvType(t, hd).ok()) continue;
      for (int n : {3, 33, 70}) {
        CheckCase(hd, hd, t, t, Coding::kPlain, n, 150, ++seed, 1e-4);
        if (hd % 2 == 0) CheckCase(hd, hd, t, t, Coding::kRopeOffset, n, 150, ++seed, 1e-4);
      }
    }
  }
}

// The thread-local accumulator grows with head_dim_v; a large hv after a small one, and a small
// one after a large, with more queries than one walk and a remainder tile.
TEST(AttentionWalk, BufferGrowsAcrossCalls) {
  uint32_t seed = 1300;
  for (int32_t hv : {8, 1024, 16, 1000, 33}) {
    CheckCase(16, hv, KvType::kF32, KvType::kF32, Coding::kPlain, 67, 40, ++seed, 5e-5);
  }
}

// A value an f16 cache cannot hold (|v| > 65504 stores as Inf) written at position 5: a query
// that sees 5 keys never reads it alone, but in a tile with one that sees 6 its weight 0 meets
// Inf in the FMA (0 * Inf = NaN). Verification puts the drafts' keys after the earlier tokens'.
TEST(AttentionWalk, AnInfValuePastAQuerysKeysDoesNotReachIt) {
  Head head(64, 64, 32, 3, KvType::kF32, KvType::kF16, Coding::kPlain);
  std::vector<float> v(64, 0.5f);
  v[7] = 1e6f;  // Inf in f16
  StoreValue(KvType::kF16, head.v_pool.data() + head.ids[0] * head.view.v_block_stride, 64, 5,
             v.data());
  std::vector<float> q(2 * 64, 0.1f);
  const float* qp[2] = {q.data(), q.data() + 64};
  const int32_t n_keys[2] = {5, 6};
  const AttentionShape shape{64, 64, 0.125f};
  Out alone(1, 64), together(2, 64);
  Attend(shape, head.view, qp, n_keys, 1, alone.rows.data());
  Attend(shape, head.view, qp, n_keys, 2, together.rows.data());
  for (int d = 0; d < 64; ++d) ASSERT_TRUE(std::isfinite(alone.data[d]));
  EXPECT_EQ(std::memcmp(alone.data.data(), together.rows[0], 64 * sizeof(float)), 0)
      << "query 0 (5 keys) alone " << alone.data[7] << ", beside a query of 6 keys "
      << together.rows[0][7];
}

// Contexts over several key partitions (attention.h): partials merged in order, against the
// reference, and still bit-identical alone and among other queries.
TEST(AttentionWalk, KeysOverSeveralPartitions) {
  uint32_t seed = 1500;
  for (KvType t : {KvType::kF32, KvType::kF16, KvType::kQ8_0, KvType::kQ4_0, KvType::kTurbo4}) {
    for (int n : {1, 4, 7, 20}) {
      CheckCase(64, 64, t, t, Coding::kPlain, n, 2 * kKeyPartitionKeys + 37, ++seed, 1e-4);
    }
    CheckCase(64, 64, t, t, Coding::kRopeOffset, 5, kKeyPartitionKeys + 1, ++seed, 1e-4);
  }
}

// Split-K as the forward pass runs it: every partition of n_heads heads' queries in one call
// per partition (the heads' tiles side by side, more heads than one walk takes at once), then
// each query's partials merged: bit-identical to Attend on each head alone.
void CheckSplitHeads(KvType t, Coding coding, int n_heads, int n, int32_t last_keys,
                     uint32_t seed) {
  SCOPED_TRACE(std::string(KvTypeName(t)) + " " + CodingName(coding) + " heads " +
               std::to_string(n_heads) + " n " + std::to_string(n) + " keys " +
               std::to_string(last_keys));
  constexpr int32_t hd = 64;
  std::vector<std::unique_ptr<Head>> heads;
  std::vector<KvHeadView> views;
  for (int h = 0; h < n_heads; ++h) {
    heads.push_back(std::make_unique<Head>(hd, hd, last_keys, seed + h, t, t, coding));
    views.push_back(heads.back()->view);
  }
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const size_t rows = static_cast<size_t>(n_heads) * n;
  std::vector<float> q(rows * hd);
  for (float& x : q) x = dist(rng);
  std::vector<const float*> qp(rows);
  for (size_t r = 0; r < rows; ++r) qp[r] = q.data() + r * hd;
  // Verification-like: n queries = tokens x group, each token one key more than the last.
  std::vector<int32_t> n_keys(n);
  for (int i = 0; i < n; ++i) n_keys[i] = last_keys - (n - 1 - i) / 2;
  const AttentionShape shape{hd, hd, 0.125f};
  const int32_t parts = KeyPartitions(last_keys);
  const size_t stride = AttentionPartialStride(shape);
  std::vector<float> o(parts * rows * stride, -3.0f), m(parts * rows), l(parts * rows);
  for (int32_t p = 0; p < parts; ++p) {
    AttendPartition(shape, views.data(), n_heads, qp.data(), n_keys.data(), n, p,
                    {o.data() + p * rows * stride, m.data() + p * rows, l.data() + p * rows});
  }
  Out alone(n, hd);
  std::vector<float> merged(hd);
  for (int h = 0; h < n_heads; ++h) {
    Attend(shape, views[h], qp.data() + h * n, n_keys.data(), n, alone.rows.data());
    for (int i = 0; i < n; ++i) {
      const size_t r = static_cast<size_t>(h) * n + i;
      MergePartitions(shape, t, KeyPartitions(n_keys[i]), o.data() + r * stride, rows * stride,
                      m.data() + r, l.data() + r, rows, merged.data());
      ASSERT_EQ(std::memcmp(merged.data(), alone.rows[i], hd * sizeof(float)), 0)
          << "head " << h << " query " << i << " (n_keys " << n_keys[i] << ")";
    }
  }
}

TEST(AttentionPartition, HeadsTogetherMatchAttendBitForBit) {
  uint32_t seed = 1700;
  // Group sizes of llama (4), qwen3 (2), qwen2 (7), verification (10), and 1; 9 heads of 4 and
  // 8 of 8 take two walks; a query count ending a partition exactly and just past it.
  for (auto [n_heads, n] : std::vector<std::pair<int, int>>{
           {8, 4}, {8, 2}, {2, 7}, {9, 4}, {8, 8}, {3, 1}, {1, 3}, {4, 5}}) {
    for (int32_t keys : {kKeyPartitionKeys, kKeyPartitionKeys + 1, 2 * kKeyPartitionKeys + 300}) {
      CheckSplitHeads(KvType::kF16, Coding::kPlain, n_heads, n, keys, seed += 20);
    }
  }
  for (KvType t : {KvType::kQ8_0, KvType::kQ4_0, KvType::kTurbo4, KvType::kBF16}) {
    CheckSplitHeads(t, Coding::kPlain, 8, 4, 2 * kKeyPartitionKeys + 5, seed += 20);
    CheckSplitHeads(t, Coding::kRopeOffset, 3, 2, kKeyPartitionKeys + 17, seed += 20);
  }
}

TEST(AttentionPartition, OnePartitionIsTheWholeAttention) {
  // Below one partition's keys, the merge of the single partial is o / l exactly: the result
  // equals the reference as closely as Attend does.
  CheckCase(64, 64, KvType::kF16, KvType::kF16, Coding::kPlain, 4, kKeyPartitionKeys, 1900, 1e-4);
  CheckSplitHeads(KvType::kF16, Coding::kPlain, 8, 4, 700, 1901);
}

}  // namespace
}  // namespace kvs
