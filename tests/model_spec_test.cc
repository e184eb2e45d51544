// The per-layer model spec (model/layer_spec.h): what each architecture file reads, and that the
// forward pass follows the specs rather than the architecture's name.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "engine/single_sequence.h"
#include "model/config.h"
#include "model/weights.h"
#include "testing/tiny_model.h"

namespace kvs {
namespace {

std::unique_ptr<Model> Load(gguf::Writer w) {
  auto f = gguf::File::FromBytes(w.Serialize());
  EXPECT_TRUE(f.ok()) << f.error();
  auto model = Model::FromFile(std::move(*f));
  EXPECT_TRUE(model.ok()) << model.error();
  return model.ok() ? std::move(*model) : nullptr;
}

struct ArchSpecCase {
  const char* arch;
  bool neox;
  bool qk_norm;
};

class ArchSpecTest : public ::testing::TestWithParam<ArchSpecCase> {};

TEST_P(ArchSpecTest, EveryLayerHasTheFamilysSpec) {
  testing::TinyModelSpec spec;
  spec.arch = GetParam().arch;
  spec.n_layer = 3;
  spec.head_dim = 16;
  auto model = Load(testing::MakeTinyModelWriter(spec));
  ASSERT_NE(model, nullptr);
  const ModelConfig& c = model->config();
  ASSERT_EQ(c.ropes.size(), 1u);
  EXPECT_EQ(c.ropes[0].neox, GetParam().neox);
  EXPECT_EQ(c.ropes[0].n_rot, 16);
  EXPECT_FALSE(c.ropes[0].freq_factors);
  ASSERT_NE(c.uniform_rope(), nullptr);
  ASSERT_EQ(c.layers.size(), 3u);
  for (const LayerSpec& l : c.layers) {
    EXPECT_EQ(l.attention, AttentionKind::kGlobal);
    EXPECT_EQ(l.rope, 0);
    EXPECT_EQ(l.qk_norm, GetParam().qk_norm);
    EXPECT_EQ(l.norms, NormPlacement::kPre);
    EXPECT_EQ(l.feed_forward, FeedForwardKind::kSwiGlu);
  }
  EXPECT_EQ(model->Rope(0).neox, GetParam().neox);
  EXPECT_EQ(model->Rope(0).freq_factors, nullptr);
}

INSTANTIATE_TEST_SUITE_P(Families, ArchSpecTest,
                         ::testing::Values(ArchSpecCase{"llama", false, false},
                                           ArchSpecCase{"qwen2", true, false},
                                           ArchSpecCase{"qwen3", true, true}),
                         [](const auto& info) { return std::string(info.param.arch); });

TEST(ArchSpec, AnUnknownArchitectureIsRefusedNamingTheOnesThatRun) {
  testing::TinyModelSpec spec;
  gguf::Writer w = testing::MakeTinyModelWriter(spec);
  w.Set("general.architecture", gguf::Value::String("gemma9"));
  auto f = gguf::File::FromBytes(w.Serialize());
  ASSERT_TRUE(f.ok());
  auto model = Model::FromFile(std::move(*f));
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.error().find("unsupported architecture 'gemma9' (kvserve runs llama, qwen2, "
                               "qwen3, gemma3)"),
            std::string::npos)
      << model.error();
}

// A llama file that carries per-head Q/K norms gets them in its specs, and the forward pass runs
// them: it follows the spec, not the architecture's name.
TEST(ArchSpec, ALlamaFileWithQkNormsRunsThem) {
  testing::TinyModelSpec spec;
  const std::vector<int32_t> tokens = {1, 40, 41, 42, 43};
  auto logits = [&](std::unique_ptr<Model> model) {
    ThreadPool pool(1);
    SingleSequence fwd(*model, pool, 16);
    std::vector<float> out(model->config().n_vocab);
    EXPECT_TRUE(fwd.Run(tokens.data(), 5, 0, 1, out.data()).ok());
    return out;
  };
  auto plain = Load(testing::MakeTinyModelWriter(spec));
  ASSERT_NE(plain, nullptr);
  EXPECT_FALSE(plain->config().layers[0].qk_norm);
  gguf::Writer normed = testing::MakeTinyModelWriter(spec);
  for (int l = 0; l < spec.n_layer; ++l) {
    for (const char* t : {"attn_q_norm", "attn_k_norm"}) {
      normed.AddTensorF32("blk." + std::to_string(l) + "." + t + ".weight",
                          {static_cast<uint64_t>(spec.head_dim)}, DType::kF32,
                          std::vector<float>(spec.head_dim, 0.5f));
    }
  }
  auto with_norms = Load(std::move(normed));
  ASSERT_NE(with_norms, nullptr);
  for (const LayerSpec& l : with_norms->config().layers) EXPECT_TRUE(l.qk_norm);
  const std::vector<float> a = logits(std::move(plain)), b = logits(std::move(with_norms));
  double diff = 0;
  for (size_t v = 0; v < a.size(); ++v) diff = std::max(diff, std::fabs(double(a[v]) - b[v]));
  EXPECT_GT(diff, 1e-3);
}

// Loads a tiny llama edited by `edit`; the error, or "" when it loads.
std::string LoadError(const std::function<void(gguf::Writer&)>& edit) {
  testing::TinyModelSpec spec;
  gguf::Writer w = testing::MakeTinyModelWriter(spec);
  edit(w);
  auto f = gguf::File::FromBytes(w.Serialize());
  if (!f.ok()) return f.error();
  auto model = Model::FromFile(std::move(*f));
  return model.ok() ? "" : model.error();
}

void AddNorm(gguf::Writer& w, int layer, const char* which, int dim = 16) {
  w.AddTensorF32("blk." + std::to_string(layer) + "." + which + ".weight",
                 {static_cast<uint64_t>(dim)}, DType::kF32, std::vector<float>(dim, 0.5f));
}

// Q/K norms are a layer's own: a layer with them runs them, one without does not, and a layer
// with only one of the two is refused (never loaded and left unused).
TEST(ArchSpec, QkNormsArePerLayerAndComeInPairs) {
  testing::TinyModelSpec spec;
  gguf::Writer w = testing::MakeTinyModelWriter(spec);
  AddNorm(w, 1, "attn_q_norm");
  AddNorm(w, 1, "attn_k_norm");
  auto model = Load(std::move(w));
  ASSERT_NE(model, nullptr);
  EXPECT_FALSE(model->config().layers[0].qk_norm);
  EXPECT_TRUE(model->config().layers[1].qk_norm);
  const std::string half = LoadError([](gguf::Writer& w) {
    for (int l = 0; l < 2; ++l) AddNorm(w, l, "attn_k_norm");
  });
  EXPECT_NE(half.find("blk.0.attn_q_norm.weight"), std::string::npos) << half;
}

TEST(ArchSpec, RopeScalingAsLlamaCppReadsIt) {
  // A factor without a type is linear (llama.cpp's default), the older key too.
  for (const char* key : {"llama.rope.scaling.factor", "llama.rope.scale_linear"}) {
    testing::TinyModelSpec spec;
    gguf::Writer w = testing::MakeTinyModelWriter(spec);
    w.Set(key, gguf::Value::Float32(4.f));
    auto model = Load(std::move(w));
    ASSERT_NE(model, nullptr);
    EXPECT_FLOAT_EQ(model->config().ropes[0].freq_scale, 0.25f) << key;
  }
  EXPECT_NE(LoadError([](gguf::Writer& w) {
              w.Set("llama.rope.scaling.type", gguf::Value::Uint32(3));
            }).find("'llama.rope.scaling.type' is not a string"),
            std::string::npos);
  EXPECT_NE(LoadError([](gguf::Writer& w) {
              w.Set("llama.rope.scaling.type", gguf::Value::String("yarn"));
            }).find("unsupported rope scaling type 'yarn'"),
            std::string::npos);
}

TEST(ArchSpec, MetadataOfTheWrongKindOrSizeIsNamed) {
  EXPECT_NE(LoadError([](gguf::Writer& w) {
              w.Set("general.architecture", gguf::Value::Uint32(1));
            }).find("'general.architecture' is not a string"),
            std::string::npos);
  // 65536 heads of 65536 dims: each allowed, their product (q_dim) past any model.
  const std::string absurd = LoadError([](gguf::Writer& w) {
    w.Set("llama.attention.head_count", gguf::Value::Uint32(65536));
    w.Set("llama.attention.head_count_kv", gguf::Value::Uint32(65536));
    w.Set("llama.attention.key_length", gguf::Value::Uint32(65536));
  });
  EXPECT_NE(absurd.find("head_count x key_length"), std::string::npos) << absurd;
}

TEST(ArchSpec, RopeFrequencyFactorsAreTheRopesWhereTheFileHasThem) {
  testing::TinyModelSpec spec;
  gguf::Writer w = testing::MakeTinyModelWriter(spec);
  w.AddTensorF32("rope_freqs.weight", {static_cast<uint64_t>(spec.head_dim / 2)}, DType::kF32,
                 std::vector<float>(spec.head_dim / 2, 2.f));
  auto model = Load(std::move(w));
  ASSERT_NE(model, nullptr);
  EXPECT_TRUE(model->config().ropes[0].freq_factors);
  const RopeParams rope = model->RopeOfLayer(1);
  ASSERT_NE(rope.freq_factors, nullptr);
  EXPECT_EQ(rope.freq_factors[0], 2.f);
}

}  // namespace
}  // namespace kvs
