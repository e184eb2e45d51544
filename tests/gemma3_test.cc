// Gemma 3 (model/arch/gemma3.cc) against a reference written from its definition in this file:
// a tiny gemma3-shaped model (head_dim 256, five local layers to a global one, a window much
// shorter than the prompt) whose logits kvserve must reproduce, computed here in double over a
// full cache with each local layer's queries masked to their window. The same model read
// without a window must differ from the windowed reference, so the check sees the window.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine_builder.h"
#include "model/config.h"
#include "model/weights.h"
#include "testing/tiny_model.h"

namespace kvs::gemma3_test {
namespace {

constexpr int32_t kLayers = 6;
constexpr int32_t kWindow = 8;
constexpr float kLocalBase = 10000.f, kGlobalBase = 1e6f, kGlobalFactor = 8.f;

testing::TinyModelSpec Spec() {
  testing::TinyModelSpec spec;
  spec.arch = "gemma3";
  spec.n_embd = 64;
  spec.n_layer = kLayers;
  spec.n_head = 2;
  spec.n_head_kv = 1;
  spec.head_dim = 256;
  spec.n_ff = 96;
  spec.n_ctx = 256;
  spec.tied_output = true;
  return spec;
}

std::vector<uint8_t> GemmaBytes(int32_t window) {
  gguf::Writer w = testing::MakeTinyModelWriter(Spec());
  w.Set("gemma3.rope.freq_base", gguf::Value::Float32(kGlobalBase));
  w.Set("gemma3.rope.scaling.type", gguf::Value::String("linear"));
  w.Set("gemma3.rope.scaling.factor", gguf::Value::Float32(kGlobalFactor));
  w.Set("gemma3.attention.layer_norm_rms_epsilon", gguf::Value::Float32(1e-6f));
  if (window > 0) w.Set("gemma3.attention.sliding_window", gguf::Value::Uint32(window));
  return w.Serialize();
}

// The file's f32 tensors, read straight from the GGUF (rows of ne0 values).
struct Tensors {
  std::unique_ptr<gguf::File> file;
  const float* operator()(const std::string& name) const {
    const gguf::TensorInfo* t = file->FindTensor(name);
    EXPECT_NE(t, nullptr) << name;
    return reinterpret_cast<const float*>(t->data);
  }
};

using Vec = std::vector<double>;

Vec MatVec(const float* w, int32_t rows, int32_t cols, const Vec& x) {
  Vec y(rows, 0.0);
  for (int32_t r = 0; r < rows; ++r) {
    for (int32_t c = 0; c < cols; ++c) y[r] += static_cast<double>(w[size_t(r) * cols + c]) * x[c];
  }
  return y;
}

void RmsNormInPlace(double* x, int32_t n, const float* w, double eps) {
  double ss = 0;
  for (int32_t i = 0; i < n; ++i) ss += x[i] * x[i];
  const double inv = 1.0 / std::sqrt(ss / n + eps);
  for (int32_t i = 0; i < n; ++i) x[i] = x[i] * inv * w[i];
}

// NeoX RoPE: dims i and i + n / 2 turned by pos * scale * base^(-2i/n).
void RopeInPlace(double* x, int32_t n, int32_t pos, double base, double scale) {
  for (int32_t i = 0; i < n / 2; ++i) {
    const double theta = pos * scale * std::pow(base, -2.0 * i / n);
    const double a = x[i], b = x[i + n / 2];
    x[i] = a * std::cos(theta) - b * std::sin(theta);
    x[i + n / 2] = a * std::sin(theta) + b * std::cos(theta);
  }
}

double GeluTanh(double g) {
  return 0.5 * g * (1 + std::tanh(std::sqrt(2 / M_PI) * (g + 0.044715 * g * g * g)));
}

// The logits of the last token after `tokens`, every layer computed over all positions; local
// layers (all but every sixth) see the last `window` keys (0: all keys).
Vec ReferenceLogits(const Tensors& t, const std::vector<int32_t>& tokens, int32_t window) {
  const testing::TinyModelSpec s = Spec();
  const int32_t d = s.n_embd, hd = s.head_dim, n = static_cast<int32_t>(tokens.size());
  const double eps = 1e-6;
  std::vector<Vec> x(n, Vec(d));
  for (int32_t i = 0; i < n; ++i) {
    for (int32_t c = 0; c < d; ++c) {
      x[i][c] = t("token_embd.weight")[size_t(tokens[i]) * d + c] * std::sqrt(double(d));
    }
  }
  for (int32_t l = 0; l < kLayers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const bool local = l % 6 < 5;
    const double base = local ? kLocalBase : kGlobalBase;
    const double scale = local ? 1.0 : 1.0 / kGlobalFactor;
    std::vector<Vec> q(n), k(n), v(n);
    for (int32_t i = 0; i < n; ++i) {
      Vec h = x[i];
      RmsNormInPlace(h.data(), d, t(p + "attn_norm.weight"), eps);
      q[i] = MatVec(t(p + "attn_q.weight"), s.n_head * hd, d, h);
      k[i] = MatVec(t(p + "attn_k.weight"), s.n_head_kv * hd, d, h);
      v[i] = MatVec(t(p + "attn_v.weight"), s.n_head_kv * hd, d, h);
      for (int32_t hh = 0; hh < s.n_head; ++hh) {
        RmsNormInPlace(&q[i][size_t(hh) * hd], hd, t(p + "attn_q_norm.weight"), eps);
        RopeInPlace(&q[i][size_t(hh) * hd], hd, i, base, scale);
      }
      for (int32_t hh = 0; hh < s.n_head_kv; ++hh) {
        RmsNormInPlace(&k[i][size_t(hh) * hd], hd, t(p + "attn_k_norm.weight"), eps);
        RopeInPlace(&k[i][size_t(hh) * hd], hd, i, base, scale);
      }
    }
    for (int32_t i = 0; i < n; ++i) {
      Vec att(size_t(s.n_head) * hd, 0.0);
      const int32_t first = local && window > 0 ? std::max(0, i - window + 1) : 0;
      for (int32_t hh = 0; hh < s.n_head; ++hh) {
        const int32_t kvh = hh / (s.n_head / s.n_head_kv);
        Vec score;
        for (int32_t j = first; j <= i; ++j) {
          double dot = 0;
          for (int32_t e = 0; e < hd; ++e)
            dot += q[i][size_t(hh) * hd + e] * k[j][size_t(kvh) * hd + e];
          score.push_back(dot / std::sqrt(double(hd)));
        }
        const double mx = *std::max_element(score.begin(), score.end());
        double sum = 0;
        for (double& z : score) sum += (z = std::exp(z - mx));
        for (int32_t j = first; j <= i; ++j) {
          for (int32_t e = 0; e < hd; ++e) {
            att[size_t(hh) * hd + e] += score[j - first] / sum * v[j][size_t(kvh) * hd + e];
          }
        }
      }
      Vec o = MatVec(t(p + "attn_output.weight"), d, s.n_head * hd, att);
      RmsNormInPlace(o.data(), d, t(p + "post_attention_norm.weight"), eps);
      for (int32_t c = 0; c < d; ++c) x[i][c] += o[c];
      Vec h = x[i];
      RmsNormInPlace(h.data(), d, t(p + "ffn_norm.weight"), eps);
      Vec g = MatVec(t(p + "ffn_gate.weight"), s.n_ff, d, h);
      const Vec u = MatVec(t(p + "ffn_up.weight"), s.n_ff, d, h);
      for (int32_t f = 0; f < s.n_ff; ++f) g[f] = GeluTanh(g[f]) * u[f];
      Vec y = MatVec(t(p + "ffn_down.weight"), d, s.n_ff, g);
      RmsNormInPlace(y.data(), d, t(p + "post_ffw_norm.weight"), eps);
      for (int32_t c = 0; c < d; ++c) x[i][c] += y[c];
    }
  }
  Vec last = x[n - 1];
  RmsNormInPlace(last.data(), d, t("output_norm.weight"), eps);
  return MatVec(t("token_embd.weight"), testing::kTinyVocab, d, last);  // tied output
}

std::vector<float> KvserveLogits(const std::vector<uint8_t>& bytes,
                                 const std::vector<int32_t>& tokens) {
  auto file = gguf::File::FromBytes(bytes);
  EXPECT_TRUE(file.ok()) << file.error();
  auto model = Model::FromFile(std::move(*file));
  EXPECT_TRUE(model.ok()) << model.error();
  ThreadPool pool(2);
  EngineBuilder builder(**model, nullptr, pool);
  auto single = builder.Single(256);
  EXPECT_TRUE(single.ok()) << single.error();
  std::vector<float> out(testing::kTinyVocab);
  // In two chunks, so that the second chunk's queries slide their windows over cached keys.
  const int32_t half = static_cast<int32_t>(tokens.size()) / 2;
  EXPECT_TRUE((*single)->Run(tokens.data(), half, 0, 1, out.data()).ok());
  EXPECT_TRUE((*single)
                  ->Run(tokens.data() + half, static_cast<int32_t>(tokens.size()) - half, half, 1,
                        out.data())
                  .ok());
  return out;
}

double MaxDiff(const std::vector<float>& a, const Vec& b) {
  double m = 0;
  for (size_t i = 0; i < b.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

TEST(Gemma3, ReadsLocalAndGlobalLayersAsLlamaCppDoes) {
  auto file = gguf::File::FromBytes(GemmaBytes(kWindow));
  ASSERT_TRUE(file.ok()) << file.error();
  auto config = ReadModelConfig(**file);
  ASSERT_TRUE(config.ok()) << config.error();
  const ModelConfig& c = *config;
  ASSERT_EQ(c.ropes.size(), 2u);
  EXPECT_FLOAT_EQ(c.rope_of(5).freq_base, kGlobalBase);
  EXPECT_FLOAT_EQ(c.rope_of(5).freq_scale, 1.f / kGlobalFactor);
  EXPECT_FLOAT_EQ(c.rope_of(0).freq_base, kLocalBase);
  EXPECT_FLOAT_EQ(c.rope_of(0).freq_scale, 1.f);
  EXPECT_TRUE(c.ropes[0].neox && c.ropes[1].neox);
  // The global layer, then each local one (groups as large as the smallest kind: one layer).
  ASSERT_EQ(c.kv_groups.size(), 6u);
  EXPECT_FALSE(c.kv_groups[0].sliding());
  for (int32_t g = 1; g < 6; ++g) EXPECT_EQ(c.kv_groups[g].window, kWindow);
  EXPECT_EQ(c.kv_slabs(), 1);
  for (int32_t l = 0; l < kLayers; ++l) {
    const LayerSpec& s = c.layers[l];
    const bool local = l != 5;
    EXPECT_EQ(s.attention, local ? AttentionKind::kSliding : AttentionKind::kGlobal) << l;
    EXPECT_EQ(s.rope, local ? 0 : 1) << l;  // in order of first use: layer 0 is local
    EXPECT_EQ(s.kv_group, local ? l + 1 : 0) << l;
    EXPECT_TRUE(s.qk_norm);
    EXPECT_EQ(s.norms, NormPlacement::kPreAndPost);
    EXPECT_EQ(s.feed_forward, FeedForwardKind::kGeGluTanh);
  }
  EXPECT_FLOAT_EQ(c.embedding_scale, 8.f);  // sqrt(64)
  EXPECT_FLOAT_EQ(c.attention_scale(), 1.f / 16.f);
  EXPECT_FLOAT_EQ(c.rms_eps, 1e-6f);
}

// Only the RoPEs some layer uses are kept, once each (key calibrations need a model of one).
TEST(Gemma3, WithoutAWindowEveryLayerIsGlobalWithTheGlobalRope) {
  auto file = gguf::File::FromBytes(GemmaBytes(0));
  ASSERT_TRUE(file.ok()) << file.error();
  auto config = ReadModelConfig(**file);
  ASSERT_TRUE(config.ok()) << config.error();
  EXPECT_EQ(config->kv_groups.size(), 1u);
  ASSERT_EQ(config->ropes.size(), 1u);
  EXPECT_FLOAT_EQ(config->ropes[0].freq_base, kGlobalBase);
  for (const LayerSpec& s : config->layers) {
    EXPECT_EQ(s.attention, AttentionKind::kGlobal);
    EXPECT_EQ(s.rope, 0);
  }
}

TEST(Gemma3, LocalAndGlobalLayersOfOneRopeShareIt) {
  gguf::Writer w = testing::MakeTinyModelWriter(Spec());  // rope.freq_base 10000, unscaled
  w.Set("gemma3.attention.sliding_window", gguf::Value::Uint32(kWindow));
  auto file = gguf::File::FromBytes(w.Serialize());
  ASSERT_TRUE(file.ok()) << file.error();
  auto config = ReadModelConfig(**file);
  ASSERT_TRUE(config.ok()) << config.error();
  ASSERT_EQ(config->ropes.size(), 1u);
  for (const LayerSpec& s : config->layers) EXPECT_EQ(s.rope, 0);
  // Every layer local (pattern 0): the local RoPE alone.
  w.Set("gemma3.rope.freq_base", gguf::Value::Float32(kGlobalBase));
  w.Set("gemma3.attention.sliding_window_pattern", gguf::Value::Uint32(0));
  auto all_local = gguf::File::FromBytes(w.Serialize());
  ASSERT_TRUE(all_local.ok()) << all_local.error();
  auto local = ReadModelConfig(**all_local);
  ASSERT_TRUE(local.ok()) << local.error();
  ASSERT_EQ(local->ropes.size(), 1u);
  EXPECT_FLOAT_EQ(local->ropes[0].freq_base, kLocalBase);
}

TEST(Gemma3, A27BShapeWhoseQueryScalarIsZeroIsRefused) {
  testing::TinyModelSpec spec = Spec();
  spec.n_layer = 62;
  spec.n_embd = 16;
  spec.n_head = 32;
  spec.n_head_kv = 32;
  spec.head_dim = 16;
  auto file = gguf::File::FromBytes(testing::MakeTinyModelWriter(spec).Serialize());
  ASSERT_TRUE(file.ok()) << file.error();
  auto config = ReadModelConfig(**file);
  ASSERT_FALSE(config.ok());
  EXPECT_NE(config.error().find("16 / 32 is 0"), std::string::npos) << config.error();
}

TEST(Gemma3, LogitsMatchAFullCacheReferenceThatMasksEachLocalLayersWindow) {
  const std::vector<uint8_t> bytes = GemmaBytes(kWindow);
  Tensors t{std::move(*gguf::File::FromBytes(bytes))};
  std::vector<int32_t> tokens = {1};
  for (int32_t i = 1; i < 40; ++i) tokens.push_back(3 + (i * 37) % 280);
  const std::vector<float> got = KvserveLogits(bytes, tokens);
  const Vec windowed = ReferenceLogits(t, tokens, kWindow);
  const Vec unwindowed = ReferenceLogits(t, tokens, 0);
  double scale = 0;
  for (double z : windowed) scale = std::max(scale, std::fabs(z));
  ASSERT_GT(scale, 0.5);
  const double tolerance = 1e-3 * scale;
  EXPECT_LT(MaxDiff(got, windowed), tolerance);
  // The window changes the logits by far more than the tolerance: the check sees it.
  EXPECT_GT(MaxDiff(got, unwindowed), 20 * tolerance);
}

}  // namespace
}  // namespace kvs::gemma3_test
