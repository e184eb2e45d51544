// The attention kernel with a first-key bound beside each query's key count (a sliding window):
// against its scalar twin, never reading blocks before every window, and a query's bits the
// same whatever queries share its tile and however its keys are partitioned.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/kv_quant.h"
#include "testing/kv_head_pool.h"

namespace kvs {
namespace {

struct QueryRun {
  std::vector<float> q, out;
  std::vector<const float*> qp;
  std::vector<float*> op;
  QueryRun(int n, int32_t hk, int32_t hv, uint32_t seed)
      : q(size_t(n) * hk), out(size_t(n) * hv), qp(n), op(n) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> dist(0.0f, 1.5f);
    for (float& x : q) x = dist(rng);
    for (int i = 0; i < n; ++i) {
      qp[i] = q.data() + size_t(i) * hk;
      op[i] = out.data() + size_t(i) * hv;
    }
  }
};

// A prefill chunk's queries under a window of w keys: query i at position p0 + i sees keys
// [max(0, p0 + i + 1 - w), p0 + i + 1).
void Windowed(int n, int32_t p0, int32_t w, std::vector<int32_t>* n_keys,
              std::vector<int32_t>* first) {
  n_keys->resize(n);
  first->resize(n);
  for (int i = 0; i < n; ++i) {
    (*n_keys)[i] = p0 + i + 1;
    (*first)[i] = std::max(0, p0 + i + 1 - w);
  }
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
    worst = std::max(worst, std::fabs(double(a[i]) - b[i]));
  }
  return worst;
}

TEST(AttentionWindow, MatchesTheScalarTwinForEveryTypeAndWindow) {
  struct Case {
    int n;
    int32_t p0, w;
  };
  // Windows inside one block, across block and pair boundaries (first keys in odd blocks), as
  // wide as the keys, and a prefill chunk whose windows slide by one per query.
  const Case cases[] = {{1, 299, 5},  {1, 299, 16},   {1, 299, 17}, {4, 200, 40},
                        {7, 150, 33}, {20, 270, 100}, {1, 40, 300}, {37, 100, 64}};
  uint32_t seed = 7;
  for (KvType t : kAllKvTypes) {
    for (auto [hk, hv] : {std::pair{8, 8}, std::pair{64, 64}, std::pair{128, 80}}) {
      testing::TestKvHead head(hk, hv, 320, ++seed, 1.0f, t, t);
      for (const Case& c : cases) {
        SCOPED_TRACE(std::string(KvTypeName(t)) + " hk " + std::to_string(hk) + " n " +
                     std::to_string(c.n) + " p0 " + std::to_string(c.p0) + " w " +
                     std::to_string(c.w));
        std::vector<int32_t> n_keys, first;
        Windowed(c.n, c.p0, c.w, &n_keys, &first);
        QueryRun kernel(c.n, hk, hv, ++seed), reference = kernel;
        for (int i = 0; i < c.n; ++i) reference.op[i] = reference.out.data() + size_t(i) * hv;
        Attend(head.shape(), head.view, kernel.qp.data(), n_keys.data(), c.n, kernel.op.data(),
               first.data());
        AttendReference(head.shape(), head.view, kernel.qp.data(), n_keys.data(), c.n,
                        reference.op.data(), first.data());
        EXPECT_LT(MaxAbsDiff(kernel.out, reference.out), 1e-4);
      }
    }
  }
}

// A sliding group returns the blocks no window reaches to the pool: the kernel must not read
// them (here they point at a NaN block), nor the values of earlier keys in a window's first
// block (an f16 overflow there, Inf, must not become 0 * Inf = NaN).
TEST(AttentionWindow, KeysBeforeEveryWindowAreNeverRead) {
  for (KvType t : {KvType::kF32, KvType::kF16, KvType::kQ8_0, KvType::kTurbo3}) {
    SCOPED_TRACE(KvTypeName(t));
    testing::TestKvHead head(64, 64, 300, 3, 1.0f, t, t);
    std::vector<int32_t> n_keys, first;
    Windowed(6, 290, 70, &n_keys, &first);  // first keys 221..226
    QueryRun clean(6, 64, 64, 4);
    Attend(head.shape(), head.view, clean.qp.data(), n_keys.data(), 6, clean.op.data(),
           first.data());
    // Blocks 0..12 (keys < 208) lie before every window: point them at the NaN block.
    for (int32_t b = 0; b < 221 / kKvBlockTokens; ++b) head.ids[b] = head.spare;
    // The key just before the earliest window, in the window's first block: huge values.
    std::vector<float> k(64, 0.5f), v(64, t == KvType::kF16 ? 1e6f : 1e30f);
    head.Store(220, k.data(), v.data());
    QueryRun poisoned = clean;
    for (int i = 0; i < 6; ++i) poisoned.op[i] = poisoned.out.data() + size_t(i) * 64;
    std::fill(poisoned.out.begin(), poisoned.out.end(), -1.0f);
    Attend(head.shape(), head.view, poisoned.qp.data(), n_keys.data(), 6, poisoned.op.data(),
           first.data());
    for (size_t i = 0; i < clean.out.size(); ++i) ASSERT_EQ(clean.out[i], poisoned.out[i]) << i;
  }
}

// Prefill and decode must agree bit for bit: a query's output alone equals its output among a
// chunk's queries whose windows start elsewhere (pairs of blocks stay at even blocks), and
// first keys of 0 give the bits of global attention.
TEST(AttentionWindow, AQuerysBitsDoNotDependOnItsNeighbours) {
  for (KvType t : {KvType::kF16, KvType::kQ4_0, KvType::kInt8}) {
    SCOPED_TRACE(KvTypeName(t));
    testing::TestKvHead head(64, 64, 300, 11, 1.0f, t, t);
    std::vector<int32_t> n_keys, first;
    // First keys 241..260: blocks 15 and 16, so that at the avx512 level a tile's pair 14 is
    // before some of its windows and not others.
    Windowed(20, 270, 30, &n_keys, &first);
    QueryRun together(20, 64, 64, 12);
    Attend(head.shape(), head.view, together.qp.data(), n_keys.data(), 20, together.op.data(),
           first.data());
    std::vector<float> alone(64);
    float* out = alone.data();
    for (int i = 0; i < 20; ++i) {
      Attend(head.shape(), head.view, together.qp.data() + i, n_keys.data() + i, 1, &out,
             first.data() + i);
      for (int d = 0; d < 64; ++d) ASSERT_EQ(alone[d], together.out[i * 64 + d]) << "query " << i;
    }
    const std::vector<int32_t> zeros(20, 0);
    QueryRun global = together, from_zero = together;
    for (int i = 0; i < 20; ++i) {
      global.op[i] = global.out.data() + i * 64;
      from_zero.op[i] = from_zero.out.data() + i * 64;
    }
    Attend(head.shape(), head.view, global.qp.data(), n_keys.data(), 20, global.op.data());
    Attend(head.shape(), head.view, from_zero.qp.data(), n_keys.data(), 20, from_zero.op.data(),
           zeros.data());
    EXPECT_EQ(global.out, from_zero.out);
  }
}

// Split-K: partitions on other threads, merged, give Attend's bits, windows starting in the
// first partition and in the second (whose earlier partitions are then empty).
TEST(AttentionWindow, PartitionsMergeToAttendsBits) {
  // 3,300 keys: four partitions, of which a window of 200 leaves the first three empty.
  testing::TestKvHead head(64, 64, 3300, 21, 1.0f, KvType::kF16, KvType::kF16);
  const AttentionShape shape = head.shape();
  for (int32_t w : {200, 1500, 3300}) {
    SCOPED_TRACE("window " + std::to_string(w));
    std::vector<int32_t> n_keys, first;
    Windowed(3, 3290, w, &n_keys, &first);
    QueryRun direct(3, 64, 64, 22);
    Attend(shape, head.view, direct.qp.data(), n_keys.data(), 3, direct.op.data(), first.data());
    const int32_t parts = KeyPartitions(n_keys.back());
    const size_t stride = AttentionPartialStride(shape);
    std::vector<float> o(size_t(parts) * 3 * stride), m(size_t(parts) * 3), l(size_t(parts) * 3);
    for (int32_t p = 0; p < parts; ++p) {
      AttendPartition(shape, &head.view, 1, direct.qp.data(), n_keys.data(), 3, p,
                      {o.data() + size_t(p) * 3 * stride, m.data() + p * 3, l.data() + p * 3},
                      first.data());
    }
    std::vector<float> merged(64);
    for (int i = 0; i < 3; ++i) {
      MergePartitions(shape, KvType::kF16, KeyPartitions(n_keys[i]), o.data() + i * stride,
                      3 * stride, m.data() + i, l.data() + i, 3, merged.data());
      for (int d = 0; d < 64; ++d) ASSERT_EQ(merged[d], direct.out[i * 64 + d]) << "query " << i;
    }
  }
}

}  // namespace
}  // namespace kvs
