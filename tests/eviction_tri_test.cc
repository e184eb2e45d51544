// The tri eviction policy (kv/tri_policy.h): its scores against a scalar twin that sums the
// predicted logit over dims with explicit rotation matrices, the keys it must rank first and
// last, relative-position invariance, bad input; and its calibration (engine/query_centres.h)
// against queries captured and turned back by the test itself.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "engine/calibration_prefill.h"
#include "engine/key_offsets.h"
#include "engine/kv_format_factory.h"
#include "engine/kv_transforms.h"
#include "engine/query_centres.h"
#include "kernels/kv_layer.h"
#include "kernels/ops.h"
#include "kv/eviction_policy.h"
#include "kv/kv_format.h"
#include "kv/kv_storage.h"
#include "kv/tri_policy.h"
#include "model/forward.h"
#include "testing/random.h"
#include "testing/test_models.h"
#include "tokenizer/tokenizer.h"

namespace kvs {
namespace {

// The test's own pairing of rotated dims: adjacent, or half apart for neox.
std::pair<int, int> Pair(int i, int n_rot, bool neox) {
  return neox ? std::pair{i, i + n_rot / 2} : std::pair{2 * i, 2 * i + 1};
}

// R(angle·θ) as a dense [dim][dim] matrix: pair i turned by angle·θ_i, unrotated dims identity.
std::vector<double> RotationMatrix(const TriCalibration& c, double angle) {
  const int dim = c.head_dim;
  std::vector<double> r(dim * dim, 0.0);
  for (int e = 0; e < dim; ++e) r[e * dim + e] = 1.0;
  for (int i = 0; i < c.n_rot / 2; ++i) {
    const auto [a, b] = Pair(i, c.n_rot, c.rope_neox);
    const double cs = std::cos(angle * c.theta[i]), sn = std::sin(angle * c.theta[i]);
    r[a * dim + a] = cs;
    r[a * dim + b] = -sn;
    r[b * dim + a] = sn;
    r[b * dim + b] = cs;
  }
  return r;
}

std::vector<double> Apply(const std::vector<double>& r, const double* x, int dim) {
  std::vector<double> y(dim, 0.0);
  for (int a = 0; a < dim; ++a) {
    for (int b = 0; b < dim; ++b) y[a] += r[a * dim + b] * x[b];
  }
  return y;
}

// The tri score as the brief defines it, slot by slot: turn the key back by its position to
// k_pre; the logit of the future query at t = p + Δ is (R(t)q̄)ᵀ(R(p)k_pre) = q̄ᵀ R(−Δ) k_pre, a
// double sum over dims; average over Δ = n_positions − p + d; max over the group; z-score per
// KV head over the slots; mean over KV heads.
std::vector<double> TriTwin(const TriCalibration& c, const EvictionInput& in) {
  const int n = in.n_slots, dim = c.head_dim, group = c.n_head / c.n_head_kv;
  std::vector<double> total(n, 0.0);
  for (int kv = 0; kv < c.n_head_kv; ++kv) {
    std::vector<double> head(n);
    for (int s = 0; s < n; ++s) {
      const float* kf = in.keys.data() + (s * c.n_head_kv + kv) * dim;
      const std::vector<double> k_post(kf, kf + dim);
      const std::vector<double> k_pre =
          Apply(RotationMatrix(c, -in.positions[s]), k_post.data(), dim);
      double best = -1e300;
      for (int g = 0; g < group; ++g) {
        const float* q = c.query_mean.data() + ((in.layer * c.n_head) + kv * group + g) * dim;
        double sum = 0.0;
        for (int d : TriPolicy::kFutureOffsets) {
          const double delta = in.n_positions - in.positions[s] + d;
          const std::vector<double> r = RotationMatrix(c, -delta);
          for (int a = 0; a < dim; ++a) {
            for (int b = 0; b < dim; ++b) sum += q[a] * r[a * dim + b] * k_pre[b];
          }
        }
        best = std::max(best, sum / TriPolicy::kFutureOffsets.size() / std::sqrt(dim));
      }
      head[s] = best;
    }
    const double mean = std::accumulate(head.begin(), head.end(), 0.0) / n;
    double var = 0.0;
    for (double h : head) var += (h - mean) * (h - mean) / n;
    for (int s = 0; s < n; ++s) total[s] += (head[s] - mean) / std::sqrt(var) / c.n_head_kv;
  }
  return total;
}

// A calibration of random query centres over the model-like angles base^(-2i/n_rot).
std::shared_ptr<TriCalibration> RandomCalibration(int n_layer, int n_head, int n_head_kv, int dim,
                                                  int n_rot, bool neox, uint32_t seed) {
  auto c = std::make_shared<TriCalibration>();
  c->n_layer = n_layer;
  c->n_head = n_head;
  c->n_head_kv = n_head_kv;
  c->head_dim = dim;
  c->n_rot = n_rot;
  c->rope_neox = neox;
  for (int i = 0; i < n_rot / 2; ++i) {
    c->theta.push_back(static_cast<float>(std::pow(10000.0, -2.0 * i / n_rot)));
  }
  c->query_mean = testing::GaussianVector(size_t(n_layer) * n_head * dim, seed);
  return c;
}

EvictionInput Input(int32_t n, std::span<const int32_t> positions, std::span<const float> keys,
                    int32_t heads, int32_t dim, int32_t n_positions, int32_t layer) {
  EvictionInput in;
  in.n_slots = n;
  in.positions = positions;
  in.keys = keys;
  in.n_head_kv = heads;
  in.head_dim = dim;
  in.n_positions = n_positions;
  in.layer = layer;
  return in;
}

class TriTwinTest : public ::testing::TestWithParam<bool> {};

TEST_P(TriTwinTest, MatchesTheRotationMatrixTwin) {
  // 4 query heads over 2 KV heads, 12 dims of which 8 rotate: the unrotated dims count too.
  const int n = 24, heads = 2, dim = 12;
  auto cal = RandomCalibration(3, 4, heads, dim, 8, GetParam(), 11);
  std::mt19937 rng(5);
  std::vector<int32_t> positions(n);
  for (int32_t& p : positions) p = std::uniform_int_distribution<int32_t>(0, 899)(rng);
  const std::vector<float> keys = testing::GaussianVector(size_t(n) * heads * dim, 7);
  TriPolicy policy(cal);
  ASSERT_TRUE(policy.needs_keys());
  EXPECT_EQ(policy.name(), "tri");
  for (int layer : {0, 2}) {
    const EvictionInput in = Input(n, positions, keys, heads, dim, 900, layer);
    std::vector<float> scores(n);
    ASSERT_TRUE(policy.Score(in, scores).ok());
    const std::vector<double> twin = TriTwin(*cal, in);
    for (int s = 0; s < n; ++s) EXPECT_NEAR(scores[s], twin[s], 1e-4) << "layer " << layer;
  }
}

INSTANTIATE_TEST_SUITE_P(Pairing, TriTwinTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Neox" : "Adjacent"; });

TEST(TriTwin, ItsLogitIsTheModelsAttentionLogit) {
  // The twin's q̄ᵀ R(−Δ) k_pre must be what attention computes: the query turned to t by the
  // kernel's RoPE, dotted with the key turned to p. Guards the twin's sign convention.
  for (bool neox : {false, true}) {
    auto cal = RandomCalibration(1, 1, 1, 8, 8, neox, 3);
    const RopeParams rope{8, 10000.f, 1.f, neox, nullptr};
    const int32_t p = 37, t = 37 + 500;
    std::vector<float> k = testing::GaussianVector(8, 4), q = cal->query_mean, cs(8);
    const std::vector<double> k_pre(k.begin(), k.end()), q_d(q.begin(), q.end());
    RopeAngles(p, rope, cs.data());
    ApplyRope(k.data(), cs.data(), 8, neox);
    RopeAngles(t, rope, cs.data());
    ApplyRope(q.data(), cs.data(), 8, neox);
    const std::vector<double> turned = Apply(RotationMatrix(*cal, -(t - p)), k_pre.data(), 8);
    double twin = 0.0;
    for (int e = 0; e < 8; ++e) twin += q_d[e] * turned[e];
    // float angles and cos/sin on the kernel's side: ~1e-5 relative at t = 537.
    EXPECT_NEAR(DotF32Reference(q.data(), k.data(), 8), twin, 1e-3) << "neox " << neox;
    EXPECT_GT(std::abs(twin), 0.1);
  }
}

TEST(TriPolicy, AlignedKeyFirstAntiAlignedLast) {
  // Among keys of equal norm, the average predicted logit (mean_d R(Δ_d)q̄)ᵀ k_pre is largest
  // for k_pre along mean_d R(Δ_d)q̄ (Cauchy-Schwarz) and smallest for its opposite.
  const int n = 40, heads = 2, dim = 16, n_positions = 1000;
  auto cal = RandomCalibration(1, heads, heads, dim, 16, false, 21);
  std::vector<int32_t> positions(n);
  for (int s = 0; s < n; ++s) positions[s] = s * 24;
  std::vector<float> keys = testing::GaussianVector(size_t(n) * heads * dim, 22);
  const int aligned = 13, anti = 29;
  for (int s = 0; s < n; ++s) {
    for (int h = 0; h < heads; ++h) {
      float* k = keys.data() + (s * heads + h) * dim;
      std::vector<double> target(dim, 0.0);  // k_pre
      if (s == aligned || s == anti) {
        const float* qf = cal->query_mean.data() + h * dim;
        const std::vector<double> q(qf, qf + dim);
        for (int d : TriPolicy::kFutureOffsets) {
          const auto turned =
              Apply(RotationMatrix(*cal, n_positions - positions[s] + d), q.data(), dim);
          for (int e = 0; e < dim; ++e) target[e] += (s == aligned ? 1 : -1) * turned[e];
        }
        target = Apply(RotationMatrix(*cal, positions[s]), target.data(), dim);  // k_post
      } else {
        target.assign(k, k + dim);
      }
      double norm = 0.0;
      for (double v : target) norm += v * v;
      for (int e = 0; e < dim; ++e) k[e] = static_cast<float>(2.0 * target[e] / std::sqrt(norm));
    }
  }
  TriPolicy policy(cal);
  std::vector<float> scores(n);
  ASSERT_TRUE(policy.Score(Input(n, positions, keys, heads, dim, n_positions, 0), scores).ok());
  const auto [lo, hi] = std::minmax_element(scores.begin(), scores.end());
  EXPECT_EQ(hi - scores.begin(), aligned);
  EXPECT_EQ(lo - scores.begin(), anti);
  // Through SelectKept: with no sinks or window and a budget of one, the aligned key stays.
  EXPECT_EQ(*SelectKept(scores, 1, {0, 0}), (std::vector<int32_t>{aligned}));
}

TEST(TriPolicy, ScoresDependOnlyOnRelativePositions) {
  // Keys k_pre written at positions p (k_post = R(p)k_pre) with length N score as the same keys
  // written at p + shift with length N + shift; slot 0 is k_pre itself at position 0.
  for (bool neox : {false, true}) {
    const int n = 30, heads = 2, dim = 12, n_rot = 8, shift = 537;
    auto cal = RandomCalibration(1, 4, heads, dim, n_rot, neox, 31);
    const RopeParams rope{n_rot, 10000.f, 1.f, neox, nullptr};
    const std::vector<float> pre = testing::GaussianVector(size_t(n) * heads * dim, 32);
    std::vector<int32_t> pos_a(n), pos_b(n);
    std::vector<float> keys_a = pre, keys_b = pre, cs(n_rot);
    for (int s = 0; s < n; ++s) {
      pos_a[s] = 3 * s;
      pos_b[s] = 3 * s + shift;
      for (int h = 0; h < heads; ++h) {
        RopeAngles(pos_a[s], rope, cs.data());
        ApplyRope(keys_a.data() + (s * heads + h) * dim, cs.data(), n_rot, neox);
        RopeAngles(pos_b[s], rope, cs.data());
        ApplyRope(keys_b.data() + (s * heads + h) * dim, cs.data(), n_rot, neox);
      }
    }
    TriPolicy policy(cal);
    std::vector<float> a(n), b(n);
    ASSERT_TRUE(policy.Score(Input(n, pos_a, keys_a, heads, dim, 3 * n, 0), a).ok());
    ASSERT_TRUE(policy.Score(Input(n, pos_b, keys_b, heads, dim, 3 * n + shift, 0), b).ok());
    for (int s = 0; s < n; ++s) EXPECT_NEAR(a[s], b[s], 1e-4) << "slot " << s << " neox " << neox;
    // And the positions matter: the same stored keys a different distance back score otherwise.
    ASSERT_TRUE(policy.Score(Input(n, pos_a, keys_a, heads, dim, 3 * n + 200, 0), b).ok());
    double diff = 0.0;
    for (int s = 0; s < n; ++s) diff = std::max(diff, double{std::abs(a[s] - b[s])});
    EXPECT_GT(diff, 1e-2);
  }
}

TEST(TriPolicy, BadInputIsAnErrorAndANonFiniteKeyOnlyPoisonsItsSlot) {
  const int n = 8, heads = 2, dim = 8;
  auto cal = RandomCalibration(2, 4, heads, dim, 8, true, 41);
  TriPolicy policy(cal);
  std::vector<int32_t> pos(n);
  std::iota(pos.begin(), pos.end(), 0);
  std::vector<float> keys = testing::GaussianVector(size_t(n) * heads * dim, 42), scores(n);
  ASSERT_TRUE(policy.Score(Input(n, pos, keys, heads, dim, n, 1), scores).ok());
  std::vector<float> few(n - 1);
  EXPECT_FALSE(policy.Score(Input(n, pos, keys, heads, dim, n, 1), few).ok());
  EXPECT_FALSE(
      policy.Score(Input(n, std::span(pos).first(n - 1), keys, heads, dim, n, 1), scores).ok());
  EXPECT_FALSE(
      policy.Score(Input(n, pos, std::span(keys).first(keys.size() - 1), heads, dim, n, 1), scores)
          .ok());
  EXPECT_FALSE(policy.Score(Input(n, pos, keys, 1, 2 * dim, n, 1), scores).ok());  // head shape
  EXPECT_FALSE(policy.Score(Input(n, pos, keys, -heads, -dim, n, 1), scores).ok());
  EXPECT_FALSE(policy.Score(Input(-1, pos, keys, heads, dim, n, 1), scores).ok());
  const Status no_layer = policy.Score(Input(n, pos, keys, heads, dim, n, 2), scores);
  ASSERT_FALSE(no_layer.ok());
  EXPECT_NE(no_layer.message().find("layer 2"), std::string::npos) << no_layer.message();
  EXPECT_FALSE(policy.Score(Input(n, pos, keys, heads, dim, n, -1), scores).ok());
  // A key at or past the sequence's length (the next token's position) cannot be cached yet.
  EXPECT_FALSE(policy.Score(Input(n, pos, keys, heads, dim, n - 1, 1), scores).ok());
  pos[0] = -1;
  EXPECT_FALSE(policy.Score(Input(n, pos, keys, heads, dim, n, 1), scores).ok());
  pos[0] = 0;

  keys[(3 * heads + 1) * dim + 2] = std::numeric_limits<float>::quiet_NaN();  // slot 3, second head
  keys[5 * heads * dim] = std::numeric_limits<float>::infinity();
  ASSERT_TRUE(policy.Score(Input(n, pos, keys, heads, dim, n, 1), scores).ok());
  for (int s = 0; s < n; ++s) {
    EXPECT_EQ(std::isnan(scores[s]), s == 3 || s == 5) << "slot " << s << ": " << scores[s];
  }
}

TEST(TriPolicy, BadCalibrationsAreErrors) {
  auto good = RandomCalibration(2, 4, 2, 8, 6, false, 51);
  EXPECT_TRUE(good->Validate().ok());
  auto broken = [&](auto&& edit) {
    auto c = std::make_shared<TriCalibration>(*good);
    edit(*c);
    return std::shared_ptr<const TriCalibration>(c);
  };
  const std::vector<std::shared_ptr<const TriCalibration>> bad = {
      broken([](TriCalibration& c) { c.n_head = 5; }),  // not a multiple of the KV heads
      broken([](TriCalibration& c) { c.n_rot = 7; }),
      broken([](TriCalibration& c) { c.n_rot = 10; }),  // more than head_dim
      broken([](TriCalibration& c) { c.theta.pop_back(); }),
      broken([](TriCalibration& c) { c.query_mean.pop_back(); }),
      broken([](TriCalibration& c) { c.query_mean[5] = std::numeric_limits<float>::quiet_NaN(); }),
      broken([](TriCalibration& c) { c.theta[0] = std::numeric_limits<float>::quiet_NaN(); }),
      broken([](TriCalibration& c) { c.n_layer = 0; }),
  };
  std::vector<int32_t> pos = {0, 1};
  std::vector<float> keys(2 * 2 * 8, 1.0f), scores(2);
  for (size_t i = 0; i < bad.size(); ++i) {
    EXPECT_FALSE(bad[i]->Validate().ok()) << "case " << i;
    EXPECT_FALSE(MakeEvictionPolicy("tri", bad[i]).ok()) << "case " << i;
    EXPECT_FALSE(TriPolicy(bad[i]).Score(Input(2, pos, keys, 2, 8, 2, 0), scores).ok());
  }
  EXPECT_FALSE(TriPolicy(nullptr).Score(Input(2, pos, keys, 2, 8, 2, 0), scores).ok());
}

TEST(MakeEvictionPolicy, TriNeedsItsCalibration) {
  auto none = MakeEvictionPolicy("tri");
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().find("calibration"), std::string::npos) << none.error();
  auto tri = MakeEvictionPolicy("tri", RandomCalibration(1, 2, 1, 8, 8, false, 61));
  ASSERT_TRUE(tri.ok()) << tri.error();
  EXPECT_EQ((*tri)->name(), "tri");
  EXPECT_TRUE((*tri)->needs_keys());
  // The other names ignore a calibration; an unknown name lists tri.
  EXPECT_EQ((*MakeEvictionPolicy("keydiff", RandomCalibration(1, 2, 1, 8, 8, false, 61)))->name(),
            "keydiff");
  auto bad = MakeEvictionPolicy("lru");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().find("tri (pre-RoPE key geometry against calibrated query centres)"),
            std::string::npos)
      << bad.error();
}

// ---- calibration on a real model ----

TEST(MeasureTriCalibration, Stories260KQueryCentresMatchAnIndependentTap) {
  KVS_REQUIRE_MODEL(path, "stories260K.gguf");
  auto model = Model::Load(path);
  ASSERT_TRUE(model.ok()) << model.error();
  auto tok = Tokenizer::FromGguf((*model)->file());
  ASSERT_TRUE(tok.ok()) << tok.error();
  const ModelConfig& c = (*model)->config();
  const RopeSpec& r = c.ropes[0];
  const std::vector<int32_t> tokens = KeyCalibrationTokens(tok->get(), c.n_vocab);
  ASSERT_GE(tokens.size(), 16u);
  ThreadPool pool(2);
  auto cal = MeasureTriCalibration(**model, pool, tokens);
  ASSERT_TRUE(cal.ok()) << cal.error();
  const TriCalibration& t = **cal;
  ASSERT_TRUE(t.Validate().ok());
  EXPECT_EQ(t.n_layer, c.n_layer);
  EXPECT_EQ(t.n_head, c.n_head);
  EXPECT_EQ(t.n_head_kv, c.n_head_kv);
  EXPECT_EQ(t.head_dim, c.head_dim_k);
  EXPECT_EQ(t.n_rot, r.n_rot);
  EXPECT_EQ(t.rope_neox, r.neox);
  ASSERT_EQ(t.query_mean.size(), size_t(c.n_layer) * c.n_head * c.head_dim_k);
  for (float v : t.query_mean) ASSERT_TRUE(std::isfinite(v));

  // θ_i from the RoPE definition, and the kernel's angles at a few positions.
  const std::vector<float>& freqs = (*model)->weights().rope_freqs;
  ASSERT_EQ(t.theta.size(), size_t(r.n_rot / 2));
  for (int i = 0; i < r.n_rot / 2; ++i) {
    double want = r.freq_scale * std::pow(double{r.freq_base}, -2.0 * i / r.n_rot);
    if (!freqs.empty()) want /= freqs[i];
    EXPECT_NEAR(t.theta[i], want, 1e-6 * want) << "pair " << i;
  }
  const RopeParams rope{r.n_rot, r.freq_base, r.freq_scale, r.neox,
                        freqs.empty() ? nullptr : freqs.data()};
  std::vector<float> cs(r.n_rot);
  for (int32_t p : {1, 7, 63}) {
    RopeAngles(p, rope, cs.data());
    for (int i = 0; i < r.n_rot / 2; ++i) {
      EXPECT_NEAR(std::cos(p * double{t.theta[i]}), cs[i], 1e-5) << "p " << p << " pair " << i;
      EXPECT_NEAR(std::sin(p * double{t.theta[i]}), cs[r.n_rot / 2 + i], 1e-5);
    }
  }

  // The test's own tap: every layer's queries, turned back by their positions in double with
  // the test's own angles and pairing, averaged per (layer, head).
  const int32_t hd = c.head_dim_k, n = static_cast<int32_t>(tokens.size());
  std::vector<double> mean(t.query_mean.size(), 0.0);
  const int32_t n_blocks = (n + kKvBlockTokens - 1) / kKvBlockTokens;
  KvStorage storage(PlainKvFormat(ModelKvGeometry(c, kKvBlockTokens)), n_blocks);
  std::vector<int32_t> blocks(n_blocks);
  std::iota(blocks.begin(), blocks.end(), 0);
  RaggedBatch batch;
  batch.AddSequence(tokens.data(), n, 0, blocks, 0);
  ForwardPass forward(**model, pool);
  int taps = 0;
  forward.set_query_tap([&](int32_t layer, const RaggedBatch& b, const float* q) {
    ++taps;
    for (int32_t i = 0; i < b.n_tokens(); ++i) {
      for (int32_t h = 0; h < c.n_head; ++h) {
        const float* qh = q + (size_t(i) * c.n_head + h) * hd;
        std::vector<double> pre(qh, qh + hd);
        for (int j = 0; j < r.n_rot / 2; ++j) {
          double w = r.freq_scale * std::pow(double{r.freq_base}, -2.0 * j / r.n_rot);
          if (!freqs.empty()) w /= freqs[j];
          const double angle = -b.positions[i] * w;
          const auto [a, bb] = Pair(j, r.n_rot, r.neox);
          pre[a] = qh[a] * std::cos(angle) - qh[bb] * std::sin(angle);
          pre[bb] = qh[a] * std::sin(angle) + qh[bb] * std::cos(angle);
        }
        double* m = mean.data() + (size_t(layer) * c.n_head + h) * hd;
        for (int e = 0; e < hd; ++e) m[e] += pre[e] / n;
      }
    }
  });
  ASSERT_TRUE(forward.Run(batch, storage.layers(), nullptr).ok());
  ASSERT_EQ(taps, c.n_layer);
  double spread = 0.0;
  for (size_t e = 0; e < mean.size(); ++e) {
    ASSERT_NEAR(t.query_mean[e], mean[e], 1e-4) << "value " << e;
    spread = std::max(spread, std::abs(mean[e]));
  }
  EXPECT_GT(spread, 1e-2) << "query centres all near zero: the comparison proves nothing";
}

TEST(MeasureTriCalibration, IsDeterministicAndRejectsBadTokens) {
  KVS_REQUIRE_MODEL(path, "stories260K.gguf");
  auto model = Model::Load(path);
  ASSERT_TRUE(model.ok()) << model.error();
  const std::vector<int32_t> tokens = KeyCalibrationTokens(nullptr, (*model)->config().n_vocab);
  ThreadPool pool(2);
  auto a = MeasureTriCalibration(**model, pool, tokens);
  auto b = MeasureTriCalibration(**model, pool, tokens);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->query_mean, (*b)->query_mean);
  EXPECT_EQ((*a)->theta, (*b)->theta);
  EXPECT_FALSE(MeasureTriCalibration(**model, pool, {}).ok());
  EXPECT_FALSE(MeasureTriCalibration(**model, pool, {1, -3}).ok());
}

// The three calibrations of one engine share one prefill of the built-in paragraph, and what
// each measures from it is what it measures running its own.
TEST(CalibrationRuns, KeyCodingTriAndTransformFitShareOnePrefill) {
  KVS_REQUIRE_MODEL(path, "stories260K.gguf");
  auto model = Model::Load(path);
  ASSERT_TRUE(model.ok()) << model.error();
  const Model& m = **model;
  const std::vector<int32_t> tokens = KeyCalibrationTokens(nullptr, m.config().n_vocab);
  ThreadPool pool(2);
  CalibrationRuns runs(m, pool);
  // In the order an engine asks: key coding (no queries asked), tri, the transform fit.
  auto for_keys = runs.Get(tokens, /*with_queries=*/false);
  ASSERT_TRUE(for_keys.ok()) << for_keys.error();
  const KeyCoding shared_keys = MeasureKeyCoding(m, **for_keys, KvType::kQ8_0, 256);
  auto for_tri = runs.Get(tokens, /*with_queries=*/true);
  ASSERT_TRUE(for_tri.ok());
  auto shared_tri = MeasureTriCalibration(m, **for_tri);
  ASSERT_TRUE(shared_tri.ok()) << shared_tri.error();
  auto shared_fit = FitKvTransforms(m, pool, tokens, 512, Digest128{}, &runs);
  ASSERT_TRUE(shared_fit.ok()) << shared_fit.error();
  EXPECT_EQ(runs.num_runs(), 1);

  const KeyCoding own_keys = MeasureKeyCoding(m, pool, tokens, KvType::kQ8_0, 256);
  EXPECT_EQ(shared_keys.offsets, own_keys.offsets);
  EXPECT_FALSE(own_keys.offsets.empty());
  auto own_tri = MeasureTriCalibration(m, pool, tokens);
  ASSERT_TRUE(own_tri.ok());
  EXPECT_EQ((*shared_tri)->query_mean, (*own_tri)->query_mean);
  auto own_fit = FitKvTransforms(m, pool, tokens, 512, Digest128{});
  ASSERT_TRUE(own_fit.ok());
  EXPECT_EQ(SerializeKvTransforms(*shared_fit), SerializeKvTransforms(*own_fit));

  // A long text is not kept (its K/V would stay beside the KV pool): each asks again, with
  // queries only when asked.
  std::vector<int32_t> longer(100, 5);
  EXPECT_FALSE((*runs.Get(longer, false))->has_queries());
  EXPECT_TRUE((*runs.Get(longer, true))->has_queries());
  EXPECT_EQ(runs.num_runs(), 3);
  EXPECT_FALSE(runs.Get({}, false).ok());
  EXPECT_FALSE(runs.Get(std::vector<int32_t>{1, m.config().n_vocab}, false).ok());
}

}  // namespace
}  // namespace kvs
