// The eviction foundation at its edges: SelectKept, the policies and PlanCompaction on bad and
// extreme input (empty, non-finite, overflowing, frozen prefixes), and MoveKey/MoveValue/MoveKvSlot
// never touching another lane's codes (sub-byte types pack neighbouring positions together).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "kernels/kv_layer.h"
#include "kernels/kv_quant.h"
#include "kv/compaction.h"
#include "kv/eviction_policy.h"
#include "testing/int_lists.h"

namespace kvs {
namespace {

constexpr int32_t kMax = std::numeric_limits<int32_t>::max();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// ---- SelectKept ----

TEST(SelectKeptEdges, EmptyAndTinyInputs) {
  std::vector<float> none;
  auto kept = SelectKept(none, 0, {0, 0});
  ASSERT_TRUE(kept.ok());
  EXPECT_TRUE(kept->empty());
  std::vector<float> one(1, 1.0f);
  EXPECT_EQ(*SelectKept(one, 0, {0, 0}), std::vector<int32_t>{});
  EXPECT_EQ(*SelectKept(one, 1, {0, 0}), std::vector<int32_t>{0});
  // Sinks and window larger than the sequence.
  std::vector<float> five(5, 0.0f);
  EXPECT_EQ(*SelectKept(five, 100, {50, 50}), testing::Range(0, 5));
}

TEST(SelectKeptEdges, NeverKeepsMoreThanTheBudget) {
  // frozen (30) <= budget (40) and sink + window (4 + 32) <= budget, yet frozen + window = 62.
  std::vector<float> scores(100, 0.0f);
  auto kept = SelectKept(scores, 40, {4, 32}, /*frozen=*/30);
  if (kept.ok()) {
    EXPECT_LE(static_cast<int32_t>(kept->size()), 40)
        << "SelectKept returned " << kept->size() << " slots for a budget of 40";
  }
}

TEST(SelectKeptEdges, ExtremeGuardsDoNotOverflow) {
  std::vector<float> scores(10, 0.0f);
  // sink + window overflows int32: must be an error (budget 5 < sink + window), not a wrap.
  auto kept = SelectKept(scores, 5, {kMax, 1});
  EXPECT_FALSE(kept.ok()) << "sink INT32_MAX + window 1 wrapped and passed the budget check";
  auto kept2 = SelectKept(scores, kMax, {kMax, kMax});
  EXPECT_FALSE(kept2.ok());
  // Budget INT32_MAX with modest guards keeps everything.
  EXPECT_EQ(*SelectKept(scores, kMax, {4, 4}), testing::Range(0, 10));
}

TEST(SelectKeptEdges, NonFiniteScores) {
  std::vector<float> scores = {kInf, -kInf, kNaN, 1.0f, -0.0f, 0.0f, kInf, kNaN, -kInf, 2.0f};
  auto kept = SelectKept(scores, 4, {0, 0});
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ(*kept, (std::vector<int32_t>{0, 3, 6, 9}));
  // All NaN: the latest slots.
  std::vector<float> nans(10, kNaN);
  EXPECT_EQ(*SelectKept(nans, 3, {0, 0}), (std::vector<int32_t>{7, 8, 9}));
}

// ---- policies ----

TEST(KeyDiffEdges, AllZeroKeysAndExtremes) {
  KeyDiffPolicy p;
  const int n = 8, heads = 2, dim = 4;
  std::vector<float> keys(n * heads * dim, 0.0f);
  std::vector<int32_t> pos = testing::Range(0, n);
  std::vector<float> scores(n);
  ASSERT_TRUE(p.Score({n, pos, keys, heads, dim, {}}, scores).ok());
  for (float s : scores) EXPECT_TRUE(std::isfinite(s));
  // Huge but finite keys: squares overflow float, not double.
  for (float& k : keys) k = 3e38f;
  keys[5] = -3e38f;
  ASSERT_TRUE(p.Score({n, pos, keys, heads, dim, {}}, scores).ok());
  for (float s : scores) EXPECT_TRUE(std::isfinite(s)) << s;
}

TEST(KeyDiffEdges, OneNanKeyOnlyPoisonsItsOwnSlot) {
  KeyDiffPolicy p;
  const int n = 8, heads = 1, dim = 4;
  std::mt19937 rng(1);
  std::normal_distribution<float> dist;
  std::vector<float> keys(n * heads * dim);
  for (float& k : keys) k = dist(rng);
  keys[3 * dim + 1] = kNaN;
  std::vector<int32_t> pos = testing::Range(0, n);
  std::vector<float> scores(n);
  ASSERT_TRUE(p.Score({n, pos, keys, heads, dim, {}}, scores).ok());
  int finite = 0;
  for (float s : scores) finite += std::isfinite(s);
  EXPECT_EQ(finite, n - 1) << "one NaN key made " << n - finite << " of " << n
                           << " scores non-finite: KeyDiff degrades to most-recent for everyone";
}

TEST(KeyDiffEdges, NegativeShapesAreErrorsNotThrows) {
  KeyDiffPolicy p;
  std::vector<float> keys(4, 1.0f), scores(1);
  std::vector<int32_t> pos = {0};
  // n_head_kv * head_dim = (-1) * (-4) = 4 > 0 passes the shape check, then vector(-4).
  Status s = Status::Ok();
  bool threw = false;
  try {
    s = p.Score({1, pos, keys, -1, -4, {}}, scores);
  } catch (...) {
    threw = true;
  }
  EXPECT_FALSE(threw) << "KeyDiff threw on head_dim -4";
  EXPECT_FALSE(s.ok());
}

TEST(StreamingEdges, SizesMismatch) {
  StreamingPolicy p;
  std::vector<int32_t> pos = testing::Range(0, 3);
  std::vector<float> scores(3);
  EXPECT_FALSE(p.Score({4, pos, {}, 0, 0, {}}, scores).ok());
  EXPECT_TRUE(p.Score({0, {}, {}, 0, 0, {}}, std::span<float>()).ok());
}

// ---- PlanCompaction ----

TEST(PlanCompactionEdges, FrozenSlotsMustAllBeKept) {
  const std::vector<int32_t> positions = testing::Range(0, 64);
  // Slots 0..31 are shared; kept lists that simply stop before the frozen prefix ends drop
  // shared slots (and free a shared block) without an error.
  EXPECT_FALSE(PlanCompaction(std::vector<int32_t>{}, positions, 16, 32).ok())
      << "an empty kept list dropped 32 frozen slots";
  EXPECT_FALSE(PlanCompaction(std::vector<int32_t>{0, 1}, positions, 16, 32).ok())
      << "kept {0, 1} dropped frozen slots 2..31";
}

TEST(PlanCompactionEdges, Extremes) {
  // Nothing cached, nothing kept.
  auto empty = PlanCompaction(std::vector<int32_t>{}, std::vector<int32_t>{}, 16);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->n_blocks, 0);
  EXPECT_EQ(empty->n_freed_blocks, 0);
  // Keep nothing of 40: three blocks freed.
  auto none = PlanCompaction(std::vector<int32_t>{}, testing::Range(0, 40), 16);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->n_freed_blocks, 3);
  // Block size 1.
  auto b1 = PlanCompaction(std::vector<int32_t>{2, 5}, testing::Range(0, 6), 1);
  ASSERT_TRUE(b1.ok());
  EXPECT_EQ(b1->n_blocks, 2);
  EXPECT_EQ(b1->n_freed_blocks, 4);
  // Negative kept slot.
  EXPECT_FALSE(PlanCompaction(std::vector<int32_t>{-1, 0}, testing::Range(0, 6), 1).ok());
  // A huge block size must not overflow (n_slots + block_size - 1).
  auto big = PlanCompaction(std::vector<int32_t>{0, 2}, testing::Range(0, 5), kMax);
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(big->n_blocks, 1);
  EXPECT_EQ(big->n_freed_blocks, 0);
  // Positions with INT32 extremes are carried as they are.
  std::vector<int32_t> ext = {std::numeric_limits<int32_t>::min(), 0, kMax};
  auto e = PlanCompaction(std::vector<int32_t>{0, 2}, ext, 16);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->positions, (std::vector<int32_t>{std::numeric_limits<int32_t>::min(), kMax}));
  // Frozen beyond the slots, negative frozen.
  EXPECT_FALSE(PlanCompaction(std::vector<int32_t>{0}, testing::Range(0, 3), 16, 4).ok());
  EXPECT_FALSE(PlanCompaction(std::vector<int32_t>{0}, testing::Range(0, 3), 16, -1).ok());
}

// ---- byte moves ----

// Every stored element of one head block position (key: dims of that lane; value: its row), as
// raw float bits; NaNs compare by bits.
std::vector<uint32_t> Lane(KvType kt, KvType vt, const uint8_t* kb, const uint8_t* vb, int32_t hk,
                           int32_t hv, int32_t lane) {
  std::vector<uint32_t> out;
  auto push = [&](float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    out.push_back(u);
  };
  for (int32_t d = 0; d < hk; ++d) push(LoadKey(kt, kb, hk, d, lane));
  for (int32_t d = 0; d < hv; ++d) push(LoadValue(vt, vb, hv, lane, d));
  return out;
}

// Random moves within one block and across blocks; after each, the destination holds the
// source's former element values and every other lane of both blocks is unchanged.
TEST(MoveEdges, NoNeighbourLaneIsTouchedForEveryTypeAndHeadSize) {
  for (KvType t : kAllKvTypes) {
    for (int32_t hd : {1, 3, 7, 8, 13, 16, 24, 40, 64, 72, 256}) {
      if (!ValidateKvType(t, hd).ok()) continue;
      SCOPED_TRACE(std::string(KvTypeName(t)) + " hd " + std::to_string(hd));
      const size_t bytes = KvHeadBlockBytes(t, hd);
      // Two key and two value head blocks, guard bytes around each to catch stray writes.
      const size_t guard = 64;
      std::vector<uint8_t> pool(4 * bytes + 5 * guard, 0xa5);
      uint8_t* kblk[2] = {pool.data() + guard, pool.data() + 2 * guard + bytes};
      uint8_t* vblk[2] = {pool.data() + 3 * guard + 2 * bytes, pool.data() + 4 * guard + 3 * bytes};
      std::mt19937 rng(hd * 31 + static_cast<int>(t));
      std::normal_distribution<float> dist(0.0f, 1.0f);
      std::vector<float> x(hd);
      for (int b = 0; b < 2; ++b) {
        for (int32_t lane = 0; lane < 16; ++lane) {
          for (float& e : x) e = dist(rng) * (lane + 1);
          StoreKey(t, kblk[b], hd, lane, x.data());
          for (float& e : x) e = dist(rng) * (lane + 1);
          StoreValue(t, vblk[b], hd, lane, x.data());
        }
      }
      for (int step = 0; step < 200; ++step) {
        const int sb = rng() % 2, db = rng() % 2;
        const int32_t sl = rng() % 16, dl = rng() % 16;
        std::vector<std::vector<uint32_t>> before[2];
        for (int b = 0; b < 2; ++b) {
          for (int32_t l = 0; l < 16; ++l) {
            before[b].push_back(Lane(t, t, kblk[b], vblk[b], hd, hd, l));
          }
        }
        MoveKey(t, kblk[sb], sl, kblk[db], dl, hd);
        MoveValue(t, vblk[sb], sl, vblk[db], dl, hd);
        for (int b = 0; b < 2; ++b) {
          for (int32_t l = 0; l < 16; ++l) {
            const auto now = Lane(t, t, kblk[b], vblk[b], hd, hd, l);
            const auto& want = (b == db && l == dl) ? before[sb][sl] : before[b][l];
            ASSERT_EQ(now, want) << "step " << step << ": move " << sb << ":" << sl << " -> " << db
                                 << ":" << dl << " left block " << b << " lane " << l << " wrong";
          }
        }
      }
      for (int g = 0; g < 5; ++g) {
        for (size_t i = 0; i < guard; ++i) {
          ASSERT_EQ(pool[g * (guard + bytes) + i], 0xa5) << "guard " << g << " byte " << i;
        }
      }
    }
  }
}

// MoveKvSlot over a multi-head layer with different K and V types (and head sizes), against a
// copy of every lane, including moves within one kernel block.
TEST(MoveEdges, MoveKvSlotMixedTypesManyHeads) {
  for (KvType kt : kAllKvTypes) {
    for (KvType vt : {KvType::kTurbo3, KvType::kQ4_0, KvType::kF16}) {
      for (auto [hk, hv] : {std::pair{8, 8}, std::pair{64, 24}, std::pair{40, 128}}) {
        if (!ValidateKvType(kt, hk).ok() || !ValidateKvType(vt, hv).ok()) continue;
        SCOPED_TRACE(std::string(KvTypeName(kt)) + "/" + std::string(KvTypeName(vt)) + " " +
                     std::to_string(hk) + "/" + std::to_string(hv));
        KvLayerView layer;
        layer.n_head_kv = 3;
        layer.head_dim_k = hk;
        layer.head_dim_v = hv;
        layer.k_type = kt;
        layer.v_type = vt;
        const int32_t n_blocks = 3;
        std::vector<uint8_t> k(n_blocks * layer.k_block_stride()),
            v(n_blocks * layer.v_block_stride());
        layer.k = k.data();
        layer.v = v.data();
        std::mt19937 rng(hk + hv);
        std::normal_distribution<float> dist;
        std::vector<float> kr(3 * hk), vr(3 * hv);
        for (int32_t s = 0; s < n_blocks * 16; ++s) {
          for (float& e : kr) e = dist(rng);
          for (float& e : vr) e = dist(rng);
          WriteKv(layer, s, s, kr.data(), vr.data());
        }
        auto snapshot = [&](int32_t s) {
          std::vector<uint32_t> all;
          for (int32_t h = 0; h < 3; ++h) {
            const uint8_t* kb =
                layer.k + (s / 16) * layer.k_block_stride() + h * layer.k_head_bytes();
            const uint8_t* vb =
                layer.v + (s / 16) * layer.v_block_stride() + h * layer.v_head_bytes();
            std::vector<uint32_t> l(Lane(kt, vt, kb, vb, hk, hv, s % 16));
            all.insert(all.end(), l.begin(), l.end());
          }
          return all;
        };
        for (int step = 0; step < 100; ++step) {
          const int32_t src = rng() % (n_blocks * 16);
          const int32_t dst = step % 2 ? rng() % (n_blocks * 16) : (src / 16) * 16 + rng() % 16;
          std::vector<std::vector<uint32_t>> before;
          for (int32_t s = 0; s < n_blocks * 16; ++s) before.push_back(snapshot(s));
          MoveKvSlot(layer, src, dst);
          for (int32_t s = 0; s < n_blocks * 16; ++s) {
            ASSERT_EQ(snapshot(s), s == dst ? before[src] : before[s])
                << "move " << src << " -> " << dst << " broke slot " << s;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvs
