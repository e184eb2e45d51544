// The compressed view of a model (self-speculative decoding's draft weights): its matrices, its
// forward pass against the base's, and the --draft-weights helpers.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "engine/single_sequence.h"
#include "kernels/matmul_internal.h"
#include "kernels/repack.h"
#include "model/compressed_view.h"
#include "testing/random.h"
#include "testing/test_models.h"
#include "testing/tiny_model.h"
#include "tokenizer/tokenizer.h"

namespace kvs {
namespace {

std::unique_ptr<Model> LoadOrDie(const std::string& path) {
  auto m = Model::Load(path);
  EXPECT_TRUE(m.ok()) << m.error();
  return m.ok() ? std::move(m).value() : nullptr;
}

std::unique_ptr<Model> TinyModel(const testing::TinyModelSpec& spec) {
  auto f = gguf::File::FromBytes(testing::MakeTinyModel(spec));
  EXPECT_TRUE(f.ok()) << f.error();
  auto m = Model::FromFile(std::move(*f));
  EXPECT_TRUE(m.ok()) << m.error();
  return std::move(m).value();
}

std::unique_ptr<Model> View(const Model& base, DType type, ThreadPool& pool,
                            std::optional<DType> output_type = std::nullopt) {
  CompressedViewOptions options;
  options.type = type;
  options.output_type = output_type;
  auto v = MakeCompressedView(base, options, pool);
  EXPECT_TRUE(v.ok()) << v.error();
  return v.ok() ? std::move(v).value() : nullptr;
}

// The matrices a decode step reads in full, by name, with the type the view should give them.
struct NamedMatrix {
  std::string name;
  const MatrixView* m;
};
std::vector<NamedMatrix> Matrices(const Model& model) {
  const ModelWeights& w = model.weights();
  std::vector<NamedMatrix> out = {{"output", &w.output}};
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& L = w.layers[l];
    const std::string p = "blk." + std::to_string(l) + ".";
    out.push_back({p + "wq", &L.wq});
    out.push_back({p + "wk", &L.wk});
    out.push_back({p + "wv", &L.wv});
    out.push_back({p + "wo", &L.wo});
    out.push_back({p + "w_gate", &L.w_gate});
    out.push_back({p + "w_up", &L.w_up});
    out.push_back({p + "w_down", &L.w_down});
  }
  return out;
}

// Bounds on RelativeMatMulError. Measured on the stories models' matrices: Q8_0 0.5-1.1% (at
// most 0.7% from the weights' rounding, as MatMulReference shows; the Q8_0 kernels round the
// activations to 8 bits too), Q4_0 6-12%; the worst is stories-hd64-3M's output matrix.
constexpr double kQ8_0Error = 0.02, kQ4_0Error = 0.2;

// ||view x - base x|| / ||base x|| over a few random activations.
double RelativeMatMulError(const MatrixView& view, const MatrixView& base, ThreadPool& pool) {
  const int64_t n = 4;
  const std::vector<float> x = testing::GaussianVector(static_cast<size_t>(n * base.cols), 7);
  std::vector<float> yv(static_cast<size_t>(n * base.rows)), yb(yv.size());
  MatMul(view, x.data(), n, yv.data(), pool);
  MatMul(base, x.data(), n, yb.data(), pool);
  double err = 0, norm = 0;
  for (size_t i = 0; i < yb.size(); ++i) {
    err += (double(yv[i]) - yb[i]) * (double(yv[i]) - yb[i]);
    norm += double(yb[i]) * yb[i];
  }
  return std::sqrt(err / norm);
}

// Checks every matrix of `view` against `base`: a re-quantized one has `type` and computes
// what base's does within max_rel_error; a shared one is base's, bytes and all. Returns how
// many were re-quantized.
int CheckMatrices(const Model& base, const Model& view, DType type, double max_rel_error,
                  ThreadPool& pool) {
  const auto b = Matrices(base), v = Matrices(view);
  EXPECT_EQ(b.size(), v.size());
  int requantized = 0;
  for (size_t i = 0; i < b.size() && i < v.size(); ++i) {
    const MatrixView &bm = *b[i].m, &vm = *v[i].m;
    SCOPED_TRACE(b[i].name);
    EXPECT_EQ(vm.rows, bm.rows);
    EXPECT_EQ(vm.cols, bm.cols);
    if (vm.data == bm.data) {
      EXPECT_EQ(vm.type, bm.type);
      EXPECT_EQ(vm.layout, bm.layout);
      EXPECT_EQ(vm.row_bytes, bm.row_bytes);
      // Shared only where the draft type would not be smaller or cannot hold the rows.
      EXPECT_TRUE(bm.cols % Info(type).block_elems != 0 ||
                  RowBytes(type, static_cast<size_t>(bm.cols)) >= bm.row_bytes);
      continue;
    }
    ++requantized;
    EXPECT_EQ(vm.type, type);
    EXPECT_EQ(vm.row_bytes, RowBytes(type, static_cast<size_t>(vm.cols)));
    EXPECT_LT(vm.row_bytes, bm.row_bytes);
    MatrixView rows = vm;
    rows.layout = WeightLayout::kRows;
    EXPECT_EQ(vm.layout, CanInterleave(rows) ? WeightLayout::kInterleaved16 : WeightLayout::kRows);
    EXPECT_LT(RelativeMatMulError(vm, bm, pool), max_rel_error);
  }
  return requantized;
}

class RealModelTest : public ::testing::TestWithParam<const char*> {};

TEST_P(RealModelTest, Q8_0ViewMatricesMatchBase) {
  KVS_REQUIRE_MODEL(path, GetParam());
  auto base = LoadOrDie(path);
  ASSERT_TRUE(base);
  ThreadPool pool(2);
  auto view = View(*base, DType::kQ8_0, pool);
  ASSERT_TRUE(view);
  EXPECT_GT(CheckMatrices(*base, *view, DType::kQ8_0, kQ8_0Error, pool), 0);

  EXPECT_FALSE(view->has_file());
  EXPECT_TRUE(base->has_file());
  EXPECT_GT(view->owned_bytes(), 0u);
  EXPECT_NE(view->weights_digest(), base->weights_digest());
  EXPECT_LT(view->WeightBytesPerToken(), base->WeightBytesPerToken());
  const ModelWeights &bw = base->weights(), &vw = view->weights();
  EXPECT_EQ(vw.token_embd.data, bw.token_embd.data);  // shared, see compressed_view.cc
  EXPECT_EQ(vw.output_norm, bw.output_norm);
  EXPECT_EQ(vw.layers[0].attn_norm, bw.layers[0].attn_norm);
  EXPECT_EQ(view->config().n_vocab, base->config().n_vocab);
  EXPECT_EQ(view->config().n_layer, base->config().n_layer);

  // The Q4_0 view: more error, still the same product.
  auto q4 = View(*base, DType::kQ4_0, pool);
  ASSERT_TRUE(q4);
  EXPECT_GT(CheckMatrices(*base, *q4, DType::kQ4_0, kQ4_0Error, pool), 0);
  EXPECT_LT(q4->owned_bytes(), view->owned_bytes());
  EXPECT_NE(q4->weights_digest(), view->weights_digest());
}

// stories260K's ffn_down has 172 columns, not a whole number of 32-value blocks: it stays F32,
// shared with the base, while the layer's other matrices are re-quantized.
TEST(CompressedView, Stories260KFfnDownKeepsItsType) {
  KVS_REQUIRE_MODEL(path, "stories260K.gguf");
  auto base = LoadOrDie(path);
  ASSERT_TRUE(base);
  ThreadPool pool(2);
  auto view = View(*base, DType::kQ8_0, pool);
  ASSERT_TRUE(view);
  const LayerWeights &b = base->weights().layers[0], &v = view->weights().layers[0];
  ASSERT_EQ(b.w_down.cols, 172);
  EXPECT_EQ(v.w_down.type, DType::kF32);
  EXPECT_EQ(v.w_down.data, b.w_down.data);
  EXPECT_EQ(v.w_up.type, DType::kQ8_0);
}

// A story in the style the stories models were trained on, long enough for 64 positions.
constexpr char kStory[] =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun. "
    "One day, she saw a big red ball in the park. She ran to the ball and kicked it very hard. "
    "The ball flew over the fence and into the garden of an old man. Lily was sad, but the old "
    "man smiled and gave the ball back to her. They became good friends and played every day.";

// The fraction of positions where the view's argmax equals the base's, over the story.
double ArgmaxAgreement(const Model& base, const Model& view, ThreadPool& pool, int n) {
  auto tok = Tokenizer::FromGguf(base.file());
  EXPECT_TRUE(tok.ok()) << tok.error();
  std::vector<int32_t> ids = (*tok)->Encode(kStory, /*add_special=*/true, false);
  EXPECT_GE(static_cast<int>(ids.size()), n);
  ids.resize(std::min<size_t>(ids.size(), static_cast<size_t>(n)));
  const int32_t V = base.config().n_vocab, len = static_cast<int32_t>(ids.size());
  auto argmaxes = [&](const Model& m) {
    SingleSequence seq(m, pool, 128);
    std::vector<float> logits(static_cast<size_t>(len) * V);
    EXPECT_TRUE(seq.Run(ids.data(), len, 0, len, logits.data()).ok());
    std::vector<int32_t> out(len);
    for (int32_t i = 0; i < len; ++i) {
      const float* row = logits.data() + static_cast<size_t>(i) * V;
      out[i] = static_cast<int32_t>(std::max_element(row, row + V) - row);
    }
    return out;
  };
  const std::vector<int32_t> a = argmaxes(base), b = argmaxes(view);
  int same = 0;
  for (int32_t i = 0; i < len; ++i) same += a[i] == b[i];
  return static_cast<double>(same) / len;
}

// Measured over 64 positions of kStory: Q8_0 1.000 on both models; Q4_0 0.922 on
// stories-hd64-3M, 0.859 on stories260K.
TEST_P(RealModelTest, ViewForwardAgreesWithBase) {
  KVS_REQUIRE_MODEL(path, GetParam());
  auto base = LoadOrDie(path);
  ASSERT_TRUE(base);
  ThreadPool pool(2);
  auto q8 = View(*base, DType::kQ8_0, pool);
  auto q4 = View(*base, DType::kQ4_0, pool);
  ASSERT_TRUE(q8 && q4);
  const double a8 = ArgmaxAgreement(*base, *q8, pool, 64);
  const double a4 = ArgmaxAgreement(*base, *q4, pool, 64);
  std::printf("%s: top-1 agreement with the base over 64 positions: q8_0 %.3f, q4_0 %.3f\n",
              GetParam(), a8, a4);
  RecordProperty("q8_0_agreement", std::to_string(a8));
  RecordProperty("q4_0_agreement", std::to_string(a4));
  EXPECT_GE(a8, 0.9);
  EXPECT_GE(a4, 0.7);
  EXPECT_GE(a8, a4);
}

INSTANTIATE_TEST_SUITE_P(Stories, RealModelTest,
                         ::testing::Values("stories260K.gguf", "stories-hd64-3M.gguf"),
                         [](const auto& info) {
                           std::string s = info.param;
                           return s.substr(0, s.find('.')) == "stories260K" ? std::string("S260K")
                                                                            : std::string("Hd64");
                         });

// A tiny model whose n_ff (72) is no multiple of 32: ffn_down keeps F32 and its bytes, the
// other matrices become Q8_0; gate and up (72 rows, not a multiple of 16) stay in rows.
TEST(CompressedView, RowsThatCannotHoldTheTypeKeepTheirs) {
  testing::TinyModelSpec spec;
  spec.n_ff = 72;
  auto base = TinyModel(spec);
  ThreadPool pool(2);
  auto view = View(*base, DType::kQ8_0, pool);
  ASSERT_TRUE(view);
  EXPECT_GT(CheckMatrices(*base, *view, DType::kQ8_0, kQ8_0Error, pool), 0);
  for (size_t l = 0; l < view->weights().layers.size(); ++l) {
    const LayerWeights &b = base->weights().layers[l], &v = view->weights().layers[l];
    EXPECT_EQ(v.w_down.type, DType::kF32);
    EXPECT_EQ(v.w_down.data, b.w_down.data);
    EXPECT_EQ(v.w_up.type, DType::kQ8_0);
    EXPECT_EQ(v.w_up.layout, WeightLayout::kRows);
  }
}

// Q8_0 is not smaller than Q8_0: a Q8_0 view of a Q8_0 model is the model (owning nothing),
// while its Q4_0 view re-quantizes from the interleaved Q8_0 layout (ReadRow).
TEST(CompressedView, Q8_0BaseSharesOrShrinks) {
  testing::TinyModelSpec spec;
  spec.weight_type = DType::kQ8_0;
  auto base = TinyModel(spec);
  // Interleaved where this build has the kernel for it (AVX-512), the file's rows otherwise.
  ASSERT_EQ(base->weights().layers[0].wq.layout,
            matmul_internal::InterleavedKernelAvailable(DType::kQ8_0) ? WeightLayout::kInterleaved16
                                                                      : WeightLayout::kRows);
  ThreadPool pool(2);
  auto same = View(*base, DType::kQ8_0, pool);
  ASSERT_TRUE(same);
  EXPECT_EQ(CheckMatrices(*base, *same, DType::kQ8_0, 0, pool), 0);
  EXPECT_EQ(same->owned_bytes(), 0u);
  EXPECT_NE(same->weights_digest(), base->weights_digest());
  auto q4 = View(*base, DType::kQ4_0, pool);
  ASSERT_TRUE(q4);
  EXPECT_EQ(CheckMatrices(*base, *q4, DType::kQ4_0, kQ4_0Error, pool),
            static_cast<int>(Matrices(*base).size()));
}

// A tied output matrix is re-quantized on its own (to output_type here), the embedding stays
// the base's: the view unties them.
TEST(CompressedView, TiedOutputIsUntiedWithItsOwnType) {
  testing::TinyModelSpec spec;
  spec.tied_output = true;
  auto base = TinyModel(spec);
  ASSERT_EQ(base->weights().output.data, base->weights().token_embd.data);
  ThreadPool pool(2);
  auto view = View(*base, DType::kQ4_0, pool, DType::kQ8_0);
  ASSERT_TRUE(view);
  const ModelWeights& w = view->weights();
  EXPECT_EQ(w.token_embd.data, base->weights().token_embd.data);
  EXPECT_EQ(w.token_embd.type, DType::kF32);
  EXPECT_NE(w.output.data, w.token_embd.data);
  EXPECT_EQ(w.output.type, DType::kQ8_0);
  EXPECT_EQ(w.layers[0].wq.type, DType::kQ4_0);
  EXPECT_LT(RelativeMatMulError(w.output, base->weights().output, pool), kQ8_0Error);
  // Different output types make different views.
  auto plain = View(*base, DType::kQ4_0, pool);
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->weights().output.type, DType::kQ4_0);
  EXPECT_NE(plain->weights_digest(), view->weights_digest());
}

// The view runs as a model of its own, threads and all, and a view of a view works too.
TEST(CompressedView, ViewRunsAndNests) {
  auto base = TinyModel({});
  ThreadPool pool(3);
  auto f16 = View(*base, DType::kF16, pool);
  ASSERT_TRUE(f16);
  EXPECT_EQ(f16->weights().layers[0].wq.type, DType::kF16);
  auto q4 = View(*f16, DType::kQ4_0, pool);
  ASSERT_TRUE(q4);
  EXPECT_EQ(q4->weights().layers[0].wq.type, DType::kQ4_0);
  const int32_t V = base->config().n_vocab;
  const std::vector<int32_t> tokens = {1, 40, 7, 260, 99};
  for (const Model* m : {base.get(), f16.get(), q4.get()}) {
    SingleSequence seq(*m, pool, 16);
    std::vector<float> logits(static_cast<size_t>(V) * tokens.size());
    ASSERT_TRUE(seq.Run(tokens.data(), 5, 0, 5, logits.data()).ok());
    for (float x : logits) ASSERT_TRUE(std::isfinite(x));
  }
}

TEST(CompressedView, RefusesTypesItCannotWrite) {
  auto base = TinyModel({});
  ThreadPool pool(1);
  CompressedViewOptions options;
  options.type = DType::kQ4_K;
  auto v = MakeCompressedView(*base, options, pool);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.error().find("q4_k"), std::string::npos) << v.error();
  options.type = DType::kQ8_0;
  options.output_type = DType::kQ6_K;
  EXPECT_FALSE(MakeCompressedView(*base, options, pool).ok());
}

TEST(DraftWeights, ParseAcceptsTheThreeTypes) {
  EXPECT_EQ(*ParseDraftWeightsType("q8_0"), DType::kQ8_0);
  EXPECT_EQ(*ParseDraftWeightsType("Q4_0"), DType::kQ4_0);
  EXPECT_EQ(*ParseDraftWeightsType("F16"), DType::kF16);
  for (const char* bad : {"", "q8", "f32", "bf16", "q4_k", "q8_0 ", "int8"}) {
    auto t = ParseDraftWeightsType(bad);
    ASSERT_FALSE(t.ok()) << bad;
    EXPECT_NE(t.error().find("q8_0, q4_0 or f16"), std::string::npos) << t.error();
    EXPECT_NE(t.error().find(std::string("'") + bad + "'"), std::string::npos) << t.error();
  }
}

TEST(DraftWeights, ParseTakesPerGroupTypes) {
  auto o = ParseDraftWeights("q8_0,ffn=q4_0");
  ASSERT_TRUE(o.ok()) << o.error();
  EXPECT_EQ(o->type, DType::kQ8_0);
  EXPECT_EQ(o->ffn_gate_up_type, DType::kQ4_0);
  EXPECT_FALSE(o->output_type.has_value());
  EXPECT_EQ(DescribeCompressedView(*o), "q8_0,ffn=q4_0");
  o = ParseDraftWeights("q4_0,output=q8_0,ffn=f16");
  ASSERT_TRUE(o.ok()) << o.error();
  EXPECT_EQ(o->output_type, DType::kQ8_0);
  EXPECT_EQ(o->ffn_gate_up_type, DType::kF16);
  for (const char* bad : {"q8_0,", "q8_0,attn=q4_0", "q8_0,ffn", "q8_0,ffn=q5_k", ",ffn=q4_0"}) {
    EXPECT_FALSE(ParseDraftWeights(bad).ok()) << bad;
  }
}

TEST(DraftWeights, DefaultByTargetType) {
  for (auto [target, draft] : {std::pair{DType::kF32, DType::kQ8_0},
                               {DType::kF16, DType::kQ8_0},
                               {DType::kQ8_0, DType::kQ4_0},
                               {DType::kQ4_0, DType::kQ4_0}}) {
    testing::TinyModelSpec spec;
    spec.weight_type = target;
    auto base = TinyModel(spec);
    EXPECT_EQ(DefaultDraftWeightsType(*base), draft) << DTypeName(target);
  }
}

// Measures (prints, asserts nothing) how often a view's argmax is the base's next token on a
// larger model, and how long the view takes to build. Slow and needs the bench models:
//   compressed_view_test --gtest_also_run_disabled_tests --gtest_filter='*Bench*'
// KVSERVE_BENCH_MODEL picks the file (default ~/.cache/kvserve-models/llama-1b-f16.gguf).
TEST(CompressedView, DISABLED_BenchTopOneAgreement) {
  std::string path;
  if (const char* p = std::getenv("KVSERVE_BENCH_MODEL")) {
    path = p;
  } else if (const char* home = std::getenv("HOME")) {
    path = std::string(home) + "/.cache/kvserve-models/llama-1b-f16.gguf";
  }
  if (path.empty() || !std::ifstream(path)) GTEST_SKIP() << "no bench model at " << path;
  auto base = LoadOrDie(path);
  ASSERT_TRUE(base);
  ThreadPool pool(ThreadPool::DefaultThreadCount());
  const int32_t V = base->config().n_vocab;

  // The base's own greedy continuation of a short prompt: what a drafter has to guess.
  auto tok = Tokenizer::FromGguf(base->file());
  ASSERT_TRUE(tok.ok()) << tok.error();
  std::vector<int32_t> ids = (*tok)->Encode("The capital of France is", true, false);
  const int32_t n_prompt = static_cast<int32_t>(ids.size()), n_decode = 32;
  SingleSequence seq(*base, pool, 256);
  std::vector<float> logits(V);
  ASSERT_TRUE(seq.Run(ids.data(), n_prompt, 0, 1, logits.data()).ok());
  for (int32_t i = 0; i < n_decode; ++i) {
    ids.push_back(
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    if (i + 1 < n_decode) {
      ASSERT_TRUE(seq.Run(&ids.back(), 1, n_prompt + i, 1, logits.data()).ok());
    }
  }
  std::printf("%s: %d prompt tokens, %d decoded, weights %.0f MiB/token\n", path.c_str(), n_prompt,
              n_decode, base->WeightBytesPerToken() / 1048576.0);

  for (DType type : {DType::kQ8_0, DType::kQ4_0}) {
    const auto t0 = std::chrono::steady_clock::now();
    auto view = View(*base, type, pool);
    const double build_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(view);
    // The view's predictions for every decoded token, teacher-forced on the base's sequence.
    const int32_t len = static_cast<int32_t>(ids.size());
    SingleSequence vseq(*view, pool, 256);
    std::vector<float> all(static_cast<size_t>(n_decode) * V);
    ASSERT_TRUE(vseq.Run(ids.data(), len - 1, 0, n_decode, all.data()).ok());
    int same = 0;
    for (int32_t i = 0; i < n_decode; ++i) {
      const float* row = all.data() + static_cast<size_t>(i) * V;
      same += std::max_element(row, row + V) - row == ids[n_prompt + i];
    }
    std::printf(
        "  %s view: top-1 agreement %d/%d = %.3f, built in %.2f s (%d threads), %.0f "
        "MiB owned, %.0f MiB/token\n",
        std::string(DTypeName(type)).c_str(), same, n_decode, static_cast<double>(same) / n_decode,
        build_s, pool.size(), view->owned_bytes() / 1048576.0,
        view->WeightBytesPerToken() / 1048576.0);
  }
}

}  // namespace
}  // namespace kvs
