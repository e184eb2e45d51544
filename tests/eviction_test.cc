// Token eviction (issue #19), its foundation: the policies' kept sets against exact lists and a
// scalar twin, the compaction plan's moves and freed blocks as exact numbers, and the byte moves
// of kept slots against the rows as they were, for every KV type.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "kernels/attention.h"
#include "kernels/kv_layer.h"
#include "kernels/kv_quant.h"
#include "kv/compaction.h"
#include "kv/eviction_policy.h"
#include "kv/kv_storage.h"
#include "testing/int_lists.h"

namespace kvs {
namespace {

TEST(SelectKept, SinksWindowAndTheBestScoredUpToTheBudget) {
  // 20 slots, sink 2, window 3, budget 8: slots 0, 1 and 17-19, then the three best of 2..16.
  std::vector<float> scores(20, 0.0f);
  scores[9] = 5.0f;
  scores[4] = 3.0f;
  scores[12] = 3.0f;  // ties with slot 4: the later slot wins
  scores[6] = 1.0f;
  auto kept = SelectKept(scores, 8, {2, 3});
  ASSERT_TRUE(kept.ok()) << kept.error();
  EXPECT_EQ(*kept, (std::vector<int32_t>{0, 1, 4, 9, 12, 17, 18, 19}));
  // A budget at or above the length keeps everything.
  EXPECT_EQ(*SelectKept(scores, 20, {2, 3}), testing::Range(0, 20));
  EXPECT_EQ(*SelectKept(scores, 99, {2, 3}), testing::Range(0, 20));
}

TEST(SelectKept, SharedSlotsAreKeptAndCount) {
  std::vector<float> scores(20, 0.0f);
  scores[15] = 9.0f;
  // Slots 0..5 are shared (frozen): kept whatever their score, inside the budget of 8.
  auto kept = SelectKept(scores, 8, {1, 1}, /*frozen=*/6);
  ASSERT_TRUE(kept.ok()) << kept.error();
  EXPECT_EQ(*kept, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 15, 19}));
}

TEST(SelectKept, BadBudgetsAreErrorsNamingTheFlags) {
  std::vector<float> scores(50, 0.0f);
  auto small = SelectKept(scores, 10, {4, 32});
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.error().find("--kv-budget 10"), std::string::npos) << small.error();
  EXPECT_NE(small.error().find("--kv-sink + --kv-window"), std::string::npos);
  EXPECT_FALSE(SelectKept(scores, -1, {0, 0}).ok());
  EXPECT_FALSE(SelectKept(scores, 40, {-1, 4}).ok());
  EXPECT_FALSE(SelectKept(scores, 40, {4, 4}, /*frozen=*/41).ok());
}

TEST(SelectKept, NanScoresRankLastInsteadOfBreakingTheSort) {
  std::vector<float> scores(30, 1.0f);
  for (int i = 0; i < 30; i += 3) scores[i] = std::numeric_limits<float>::quiet_NaN();
  auto kept = SelectKept(scores, 10, {0, 0});
  ASSERT_TRUE(kept.ok());
  ASSERT_EQ(kept->size(), 10u);
  for (int32_t i : *kept) EXPECT_NE(i % 3, 0) << "a NaN-scored slot was kept over a scored one";
}

TEST(StreamingPolicy, KeepsTheSinksAndTheMostRecent) {
  const std::vector<int32_t> positions = testing::Range(0, 20);
  std::vector<float> scores(20);
  StreamingPolicy policy;
  ASSERT_TRUE(policy.Score({20, positions, {}, 0, 0, {}}, scores).ok());
  EXPECT_EQ(*SelectKept(scores, 8, {2, 3}), (std::vector<int32_t>{0, 1, 14, 15, 16, 17, 18, 19}));
}

// KeyDiff's scalar twin: per head 1 - cos(key, mean key), averaged over heads, in long double.
std::vector<double> KeyDiffTwin(const std::vector<float>& keys, int n, int heads, int dim) {
  std::vector<double> score(n, 0.0);
  for (int h = 0; h < heads; ++h) {
    std::vector<long double> mean(dim, 0.0L);
    for (int i = 0; i < n; ++i) {
      for (int d = 0; d < dim; ++d) mean[d] += keys[(i * heads + h) * dim + d];
    }
    for (int i = 0; i < n; ++i) {
      long double dot = 0, nk = 0, nm = 0;
      for (int d = 0; d < dim; ++d) {
        const long double k = keys[(i * heads + h) * dim + d];
        dot += k * mean[d];
        nk += k * k;
        nm += mean[d] * mean[d];
      }
      score[i] += static_cast<double>((1.0L - dot / std::sqrt(nk * nm)) / heads);
    }
  }
  return score;
}

TEST(KeyDiffPolicy, MatchesItsScalarTwinAndKeepsTheOddKeysOut) {
  const int n = 64, heads = 2, dim = 16;
  std::mt19937 rng(3);
  std::normal_distribution<float> noise(0.0f, 0.3f);
  std::vector<float> keys(n * heads * dim);
  // Keys near a common direction, but slots 10, 20 and 30 point elsewhere.
  for (int i = 0; i < n; ++i) {
    for (int h = 0; h < heads; ++h) {
      for (int d = 0; d < dim; ++d) {
        const float base = (i % 10 == 0 && i > 0 && i < 40) ? (d % 2 ? -1.0f : 1.0f) : 1.0f;
        keys[(i * heads + h) * dim + d] = base + noise(rng);
      }
    }
  }
  KeyDiffPolicy policy;
  ASSERT_TRUE(policy.needs_keys());
  const std::vector<int32_t> positions = testing::Range(0, n);
  std::vector<float> scores(n);
  ASSERT_TRUE(policy.Score({n, positions, keys, heads, dim, {}}, scores).ok());
  const std::vector<double> twin = KeyDiffTwin(keys, n, heads, dim);
  for (int i = 0; i < n; ++i) EXPECT_NEAR(scores[i], twin[i], 1e-5) << "slot " << i;
  auto kept = SelectKept(scores, 7, {2, 2});
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(*kept, (std::vector<int32_t>{0, 1, 10, 20, 30, 62, 63}));
  // Keys that do not cover the slots are an error, not a read past the end.
  std::vector<float> short_keys(keys.begin(), keys.end() - 1);
  EXPECT_FALSE(policy.Score({n, positions, short_keys, heads, dim, {}}, scores).ok());
}

TEST(H2oPolicy, KeepsTheHeavyHitters) {
  const std::vector<int32_t> positions = testing::Range(0, 12);
  std::vector<float> mass(12, 0.01f);
  mass[3] = 0.9f;
  mass[7] = 0.5f;
  mass[5] = 0.2f;
  std::vector<float> scores(12);
  H2oPolicy policy;
  ASSERT_TRUE(policy.needs_attention());
  EvictionInput input;
  input.n_slots = 12;
  input.positions = positions;
  input.attention_mass = mass;
  ASSERT_TRUE(policy.Score(input, scores).ok());
  EXPECT_EQ(*SelectKept(scores, 5, {1, 1}), (std::vector<int32_t>{0, 3, 5, 7, 11}));
  input.attention_mass = std::span(mass).first(11);
  EXPECT_FALSE(policy.Score(input, scores).ok()) << "mass that does not cover every slot";
}

TEST(SnapKvPolicy, PoolsTheObservedAttentionOverNeighbours) {
  const int32_t n = 10;
  const std::vector<int32_t> positions = testing::Range(0, n);
  std::vector<float> mass(n, 0.0f);
  mass[5] = 7.0f;
  std::vector<float> scores(n);
  SnapKvPolicy policy;
  ASSERT_TRUE(policy.Score({n, positions, {}, 0, 0, mass}, scores).ok());
  // A centred window of 7 (clipped at the ends): slots 2..8 see slot 5's mass.
  const std::vector<float> expected = {0, 0, 7.f / 6, 1, 1, 1, 1, 7.f / 6, 7.f / 5, 0};
  for (int32_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(scores[i], expected[i]) << "slot " << i;
}

TEST(AttentionMass, IsEachQuerysSoftmaxSummed) {
  // f32 keys, plain: the twin is softmax written out.
  const int32_t hk = 16, n_keys_max = 40;
  const size_t k_bytes = KvHeadBlockBytes(KvType::kF32, hk);
  std::vector<uint8_t> k_pool(3 * k_bytes), v_pool(3 * k_bytes);
  std::vector<int32_t> ids = {2, 0, 1};
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<std::vector<float>> keys(n_keys_max, std::vector<float>(hk));
  for (int32_t j = 0; j < n_keys_max; ++j) {
    for (float& x : keys[j]) x = dist(rng);
    StoreKey(KvType::kF32, k_pool.data() + ids[j / 16] * k_bytes, hk, j % 16, keys[j].data());
    StoreValue(KvType::kF32, v_pool.data() + ids[j / 16] * k_bytes, hk, j % 16, keys[j].data());
  }
  KvHeadView kv{k_pool.data(), v_pool.data(), k_bytes,     k_bytes,
                ids.data(),    KvType::kF32,  KvType::kF32};
  std::vector<float> q0(hk), q1(hk);
  for (float& x : q0) x = dist(rng);
  for (float& x : q1) x = dist(rng);
  const float* q[] = {q0.data(), q1.data()};
  const int32_t n_keys[] = {40, 25};
  const AttentionShape shape{hk, hk, 0.25f};
  std::vector<float> mass(n_keys_max, 0.0f);
  AttentionMass(shape, kv, q, n_keys, 2, mass.data());
  std::vector<double> twin(n_keys_max, 0.0);
  for (int i = 0; i < 2; ++i) {
    std::vector<double> s(n_keys[i]);
    double mx = -1e300, sum = 0;
    for (int32_t j = 0; j < n_keys[i]; ++j) {
      double dot = 0;
      for (int32_t d = 0; d < hk; ++d) dot += static_cast<double>(q[i][d]) * keys[j][d];
      s[j] = 0.25 * dot;
      mx = std::max(mx, s[j]);
    }
    for (double& x : s) sum += (x = std::exp(x - mx));
    for (int32_t j = 0; j < n_keys[i]; ++j) twin[j] += s[j] / sum;
  }
  double total = 0;
  for (int32_t j = 0; j < n_keys_max; ++j) {
    EXPECT_NEAR(mass[j], twin[j], 1e-6) << "key " << j;
    total += mass[j];
  }
  EXPECT_NEAR(total, 2.0, 1e-5);
}

TEST(MakeEvictionPolicy, KnownNamesAndAHelpfulError) {
  EXPECT_EQ((*MakeEvictionPolicy("h2o"))->name(), "h2o");
  EXPECT_EQ((*MakeEvictionPolicy("snapkv"))->name(), "snapkv");
  EXPECT_EQ((*MakeEvictionPolicy("streaming"))->name(), "streaming");
  EXPECT_EQ((*MakeEvictionPolicy("keydiff"))->name(), "keydiff");
  auto bad = MakeEvictionPolicy("lru");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().find("streaming"), std::string::npos) << bad.error();
}

TEST(PlanCompaction, MovesKeptSlotsForwardAndFreesTailBlocks) {
  // 40 slots in blocks of 16 (3 blocks); keep 6: they fit one block, two come free.
  std::vector<int32_t> positions = testing::Range(0, 40);
  for (int32_t& p : positions) p += 100;  // positions are not slots
  auto plan = PlanCompaction(std::vector<int32_t>{0, 1, 5, 20, 21, 39}, positions, 16);
  ASSERT_TRUE(plan.ok()) << plan.error();
  EXPECT_EQ(plan->moves, (std::vector<SlotMove>{{5, 2}, {20, 3}, {21, 4}, {39, 5}}));
  EXPECT_EQ(plan->positions, (std::vector<int32_t>{100, 101, 105, 120, 121, 139}));
  EXPECT_EQ(plan->n_slots, 6);
  EXPECT_EQ(plan->n_blocks, 1);
  EXPECT_EQ(plan->n_freed_blocks, 2);
  // Keeping everything moves nothing and frees nothing.
  auto all = PlanCompaction(testing::Range(0, 40), positions, 16);
  ASSERT_TRUE(all.ok());
  EXPECT_TRUE(all->moves.empty());
  EXPECT_EQ(all->n_freed_blocks, 0);
}

TEST(PlanCompaction, RefusesBadKeptListsAndMovesIntoSharedSlots) {
  const std::vector<int32_t> positions = testing::Range(0, 32);
  EXPECT_FALSE(PlanCompaction(std::vector<int32_t>{0, 3, 3}, positions, 16).ok());
  EXPECT_FALSE(PlanCompaction(std::vector<int32_t>{0, 5, 2}, positions, 16).ok());
  EXPECT_FALSE(PlanCompaction(std::vector<int32_t>{0, 32}, positions, 16).ok());
  EXPECT_FALSE(PlanCompaction(std::vector<int32_t>{0, 1}, positions, 0).ok());
  // Slots 0..3 are shared: dropping slot 2 would rewrite shared slots 2 and 3.
  EXPECT_FALSE(PlanCompaction(std::vector<int32_t>{0, 1, 3, 4}, positions, 16, 4).ok());
  EXPECT_TRUE(PlanCompaction(std::vector<int32_t>{0, 1, 2, 3, 9}, positions, 16, 4).ok());
}

// One position's stored key and value of every head, as the scalar loaders read them.
std::vector<float> StoredRow(const KvLayerView& layer, int64_t slot) {
  std::vector<float> row;
  const uint8_t* kb = layer.k + static_cast<size_t>(slot / 16) * layer.k_block_stride();
  const uint8_t* vb = layer.v + static_cast<size_t>(slot / 16) * layer.v_block_stride();
  const int32_t lane = static_cast<int32_t>(slot % 16);
  for (int32_t h = 0; h < layer.n_head_kv; ++h) {
    for (int32_t d = 0; d < layer.head_dim_k; ++d) {
      row.push_back(
          LoadKey(layer.k_type, kb + h * layer.k_head_bytes(), layer.head_dim_k, d, lane));
    }
    for (int32_t d = 0; d < layer.head_dim_v; ++d) {
      row.push_back(
          LoadValue(layer.v_type, vb + h * layer.v_head_bytes(), layer.head_dim_v, lane, d));
    }
  }
  return row;
}

// One layer of 2 KV heads of 64 dims in blocks of 16, keys and values of type t.
KvGeometry OneLayerGeometry(KvType t) {
  KvGeometry g;
  g.n_layer = 1;
  g.n_head_kv = 2;
  g.head_dim_k = g.head_dim_v = 64;
  g.block_size = 16;
  g.k_type = g.v_type = t;
  return g;
}

TEST(MoveKvSlot, KeptRowsReadBackBitForBitForEveryType) {
  for (KvType t : kAllKvTypes) {
    SCOPED_TRACE(std::string(KvTypeName(t)));
    const KvGeometry g = OneLayerGeometry(t);
    KvStorage storage(PlainKvFormat(g), 4);  // blocks 1..3 hold the sequence's 48 slots
    const KvLayerView& layer = storage.layers()[0];
    std::mt19937 rng(7);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> k(128), v(128);
    for (int32_t s = 16; s < 64; ++s) {
      for (float& x : k) x = dist(rng);
      for (float& x : v) x = dist(rng);
      WriteKv(layer, s, s - 16, k.data(), v.data());
    }
    std::vector<std::vector<float>> before;
    for (int32_t s = 0; s < 48; ++s) before.push_back(StoredRow(layer, 16 + s));
    const std::vector<int32_t> kept = {0, 1, 2, 7, 15, 16, 17, 30, 31, 33, 47};
    auto plan = PlanCompaction(kept, testing::Range(0, 48), 16);
    ASSERT_TRUE(plan.ok());
    for (const SlotMove& m : plan->moves) MoveKvSlot(layer, 16 + m.src, 16 + m.dst);
    for (size_t i = 0; i < kept.size(); ++i) {
      const std::vector<float> now = StoredRow(layer, 16 + static_cast<int64_t>(i));
      ASSERT_EQ(std::memcmp(now.data(), before[kept[i]].data(), now.size() * sizeof(float)), 0)
          << "slot " << i << " does not hold what slot " << kept[i] << " held";
    }
    // Slots after the kept ones in the last kept block are not written by the moves.
    for (int32_t s = static_cast<int32_t>(kept.size()); s < 16; ++s) {
      if (std::find(kept.begin(), kept.end(), s) != kept.end()) continue;
      const std::vector<float> now = StoredRow(layer, 16 + s);
      EXPECT_EQ(std::memcmp(now.data(), before[s].data(), now.size() * sizeof(float)), 0)
          << "slot " << s;
    }
  }
}

// LoadKeys (what keydiff and tri read) decodes keys as the scalar LoadKey does, its f16/f32 fast
// paths included, for every type; rotated types come back unrotated.
TEST(LoadKeys, MatchesTheScalarDecoderForEveryType) {
  for (KvType t : kAllKvTypes) {
    SCOPED_TRACE(std::string(KvTypeName(t)));
    const KvGeometry g = OneLayerGeometry(t);
    KvStorage storage(PlainKvFormat(g), 4);
    const KvLayerView& layer = storage.layers()[0];
    std::mt19937 rng(11);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> k(128), v(128);
    for (int32_t s = 16; s < 56; ++s) {
      for (float& x : k) x = dist(rng);
      for (float& x : v) x = dist(rng);
      WriteKv(layer, s, s - 16, k.data(), v.data());
    }
    const std::vector<int32_t> blocks = {1, 2, 3};
    for (int32_t h = 0; h < 2; ++h) {
      std::vector<float> keys(40 * 64);
      LoadKeys(layer.Head(h, blocks.data()), 64, 40, keys.data());
      for (int32_t j = 0; j < 40; ++j) {
        std::vector<float> want(64);
        const uint8_t* kb = layer.k + static_cast<size_t>(blocks[j / 16]) * layer.k_block_stride() +
                            static_cast<size_t>(h) * layer.k_head_bytes();
        for (int32_t d = 0; d < 64; ++d) want[d] = LoadKey(t, kb, 64, d, j % 16);
        if (KvTypeIsRotated(t)) RotateBack(want.data(), 64);
        for (int32_t d = 0; d < 64; ++d) {
          ASSERT_EQ(keys[j * 64 + d], want[d]) << "head " << h << " key " << j << " dim " << d;
        }
      }
    }
  }
}

// MoveKvSlots (runs of slots, what the model runner uses) leaves every byte of the layer as the
// slot-by-slot moves do, for every type, with runs that cross kernel blocks on either side.
TEST(MoveKvSlots, RunsEqualSlotBySlotMovesByteForByte) {
  for (KvType t : kAllKvTypes) {
    SCOPED_TRACE(std::string(KvTypeName(t)));
    const KvGeometry g = OneLayerGeometry(t);
    KvStorage by_slot(PlainKvFormat(g), 6), by_run(PlainKvFormat(g), 6);
    std::mt19937 rng(5);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> k(128), v(128);
    for (int32_t s = 16; s < 96; ++s) {
      for (float& x : k) x = dist(rng);
      for (float& x : v) x = dist(rng);
      WriteKv(by_slot.layers()[0], s, s, k.data(), v.data());
      WriteKv(by_run.layers()[0], s, s, k.data(), v.data());
    }
    // Kept: a sink run, then runs that shift by 3, 9 and 20 across block boundaries.
    std::vector<int32_t> kept = {0, 1, 2, 3};
    for (int32_t s = 7; s < 30; ++s) kept.push_back(s);
    for (int32_t s = 36; s < 52; ++s) kept.push_back(s);
    for (int32_t s = 63; s < 80; ++s) kept.push_back(s);
    auto plan = PlanCompaction(kept, testing::Range(0, 80), 16);
    ASSERT_TRUE(plan.ok());
    for (const SlotMove& m : plan->moves) MoveKvSlot(by_slot.layers()[0], 16 + m.src, 16 + m.dst);
    for (size_t i = 0; i < plan->moves.size();) {
      size_t len = 1;
      while (i + len < plan->moves.size() &&
             plan->moves[i + len].src == plan->moves[i].src + static_cast<int32_t>(len) &&
             plan->moves[i + len].dst == plan->moves[i].dst + static_cast<int32_t>(len)) {
        ++len;
      }
      MoveKvSlots(by_run.layers()[0], 16 + plan->moves[i].src, 16 + plan->moves[i].dst,
                  static_cast<int64_t>(len));
      i += len;
    }
    const KvLayerView& a = by_slot.layers()[0];
    const KvLayerView& b = by_run.layers()[0];
    // Blocks 1..5 (block 0 is never written: its bytes are whatever the pool held).
    EXPECT_EQ(
        std::memcmp(a.k + a.k_block_stride(), b.k + b.k_block_stride(), 5 * a.k_block_stride()), 0);
    EXPECT_EQ(
        std::memcmp(a.v + a.v_block_stride(), b.v + b.v_block_stride(), 5 * a.v_block_stride()), 0);
  }
}

}  // namespace
}  // namespace kvs
