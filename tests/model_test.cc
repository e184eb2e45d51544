#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "api/generate.h"
#include "engine/single_sequence.h"
#include "testing/test_models.h"
#include "testing/tiny_model.h"

namespace kvs {
namespace {

std::vector<int32_t> ReadGoldenIds(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line == "ids:") break;
  }
  std::getline(in, line);
  std::istringstream ss(line);
  std::vector<int32_t> ids;
  int32_t id;
  while (ss >> id) ids.push_back(id);
  return ids;
}

TEST(Golden, Stories260KGreedyMatchesReference) {
  KVS_REQUIRE_MODEL(model_path, "stories260K.gguf");
  KVS_REQUIRE_MODEL(golden_path, "stories260K.greedy256.expected.txt");
  std::vector<int32_t> golden = ReadGoldenIds(golden_path);
  ASSERT_EQ(golden.size(), 256u);
  auto model = Model::Load(model_path);
  ASSERT_TRUE(model.ok()) << model.error();
  ThreadPool pool(2);
  GenerateOptions opt;
  opt.n_predict = 256;
  opt.sampling.temperature = 0;
  std::vector<int32_t> out;
  auto stats = Generate(**model, {1}, opt, pool, [&](int32_t id) {
    out.push_back(id);
    return true;
  });
  ASSERT_TRUE(stats.ok()) << stats.error();
  ASSERT_EQ(out.size(), 256u);
  size_t same = 0;
  while (same < out.size() && out[same] == golden[same]) ++same;
  EXPECT_EQ(same, 256u) << "first divergence at generated token " << same;
  RecordProperty("matching_prefix", static_cast<int>(same));
}

struct ArchCase {
  const char* arch;
  DType type;
  bool tied;
  int32_t head_dim;
};

class TinyModelTest : public ::testing::TestWithParam<ArchCase> {
 protected:
  std::unique_ptr<Model> Load() {
    testing::TinyModelSpec spec;
    spec.arch = GetParam().arch;
    spec.weight_type = GetParam().type;
    spec.tied_output = GetParam().tied;
    spec.head_dim = GetParam().head_dim;
    auto f = gguf::File::FromBytes(testing::MakeTinyModel(spec));
    EXPECT_TRUE(f.ok()) << f.error();
    auto m = Model::FromFile(std::move(*f));
    EXPECT_TRUE(m.ok()) << m.error();
    return std::move(m).value();
  }
};

// A prompt run in one pass must give the same logits as the same tokens fed one at a time:
// the KV cache and the causal mask are then consistent.
TEST_P(TinyModelTest, PrefillMatchesTokenByTokenDecode) {
  auto model = Load();
  const int32_t V = model->config().n_vocab;
  const std::vector<int32_t> tokens = {1, 40, 7, 260, 99, 3, 288, 17, 200, 5, 61};
  const int32_t n = static_cast<int32_t>(tokens.size());
  ThreadPool pool(2);

  SingleSequence fa(*model, pool, 64);
  std::vector<float> all(static_cast<size_t>(n) * V);
  ASSERT_TRUE(fa.Run(tokens.data(), n, 0, n, all.data()).ok());

  SingleSequence fb(*model, pool, 64);
  std::vector<float> one(V);
  for (int32_t i = 0; i < n; ++i) {
    ASSERT_TRUE(fb.Run(&tokens[i], 1, i, 1, one.data()).ok());
    double max_diff = 0, max_abs = 0;
    for (int32_t v = 0; v < V; ++v) {
      max_diff =
          std::max(max_diff, std::fabs(double(one[v]) - all[static_cast<size_t>(i) * V + v]));
      max_abs = std::max(max_abs, std::fabs(double(one[v])));
    }
    EXPECT_LT(max_diff, 1e-3 * std::max(1.0, max_abs)) << "token " << i;
  }
}

// Past one key partition (1,024 keys) a decode step's attention runs split-K: partitions spread
// over the threads, heads walked together, partials merged (ForwardPass::Attention); a prompt's
// chunks run per KV head. Both must give the logits the one-pass prefill gives.
TEST_P(TinyModelTest, LongContextSplitKDecodeMatchesPrefill) {
  auto model = Load();
  const int32_t V = model->config().n_vocab;
  constexpr int32_t kPrompt = 2 * kKeyPartitionKeys + 3, kTail = 6;
  std::vector<int32_t> tokens(kPrompt);
  std::mt19937 rng(5);
  for (int32_t& t : tokens) t = 1 + static_cast<int32_t>(rng() % (V - 1));
  ThreadPool pool(2);
  SingleSequence fa(*model, pool, kPrompt);
  std::vector<float> all(static_cast<size_t>(kTail) * V);
  ASSERT_TRUE(fa.Run(tokens.data(), kPrompt, 0, kTail, all.data()).ok());
  SingleSequence fb(*model, pool, kPrompt);
  std::vector<float> one(V), decoded;
  // The decodes cross into the third partition at position 2048.
  const int32_t first = kPrompt - kTail;
  ASSERT_TRUE(fb.Run(tokens.data(), first, 0, 1, one.data()).ok());
  for (int32_t i = first; i < kPrompt; ++i) {
    ASSERT_TRUE(fb.Run(&tokens[i], 1, i, 1, one.data()).ok());
    double max_diff = 0, max_abs = 0;
    const float* ref = all.data() + static_cast<size_t>(i - first) * V;
    for (int32_t v = 0; v < V; ++v) {
      max_diff = std::max(max_diff, std::fabs(double(one[v]) - ref[v]));
      max_abs = std::max(max_abs, std::fabs(double(one[v])));
    }
    EXPECT_LT(max_diff, 1e-3 * std::max(1.0, max_abs)) << "position " << i;
    decoded.insert(decoded.end(), one.begin(), one.end());
  }
  // Bit for bit against the same tail run as one multi-token step (> 8 queries per KV head: the
  // per-head path), as speculative decoding's verification runs it.
  SingleSequence fc(*model, pool, kPrompt);
  std::vector<float> tail(static_cast<size_t>(kTail) * V);
  ASSERT_TRUE(fc.Run(tokens.data(), first, 0, 1, one.data()).ok());
  ASSERT_TRUE(fc.Run(&tokens[first], kTail, first, kTail, tail.data()).ok());
  EXPECT_EQ(std::memcmp(tail.data(), decoded.data(), tail.size() * sizeof(float)), 0);
}

// Within one key partition too, a decode step walks a sequence's KV heads together (one job per
// sequence) while a step of more than 8 queries per KV head walks head by head: the logits
// must agree bit for bit (what lets verification of drafts reproduce decode exactly).
TEST_P(TinyModelTest, ShortContextDecodeMatchesAMultiTokenStepBitForBit) {
  auto model = Load();
  const int32_t V = model->config().n_vocab;
  constexpr int32_t kFirst = 21, kTail = 9;  // kTail * group > 8 queries per KV head
  std::vector<int32_t> tokens(kFirst + kTail);
  std::mt19937 rng(11);
  for (int32_t& t : tokens) t = 1 + static_cast<int32_t>(rng() % (V - 1));
  ThreadPool pool(2);
  std::vector<float> one(V), decoded, tail(static_cast<size_t>(kTail) * V);
  SingleSequence fa(*model, pool, 64);
  ASSERT_TRUE(fa.Run(tokens.data(), kFirst, 0, 1, one.data()).ok());
  for (int32_t i = kFirst; i < kFirst + kTail; ++i) {
    ASSERT_TRUE(fa.Run(&tokens[i], 1, i, 1, one.data()).ok());
    decoded.insert(decoded.end(), one.begin(), one.end());
  }
  SingleSequence fb(*model, pool, 64);
  ASSERT_TRUE(fb.Run(tokens.data(), kFirst, 0, 1, one.data()).ok());
  ASSERT_TRUE(fb.Run(&tokens[kFirst], kTail, kFirst, kTail, tail.data()).ok());
  EXPECT_EQ(std::memcmp(tail.data(), decoded.data(), tail.size() * sizeof(float)), 0);
}

TEST_P(TinyModelTest, ThreadCountDoesNotChangeGreedyOutput) {
  auto model = Load();
  GenerateOptions opt;
  opt.n_predict = 24;
  opt.sampling.temperature = 0;
  std::vector<int32_t> a, b;
  ThreadPool p1(1), p2(2);
  ASSERT_TRUE(Generate(*model, {1, 50, 60}, opt, p1, [&](int32_t t) {
                a.push_back(t);
                return true;
              }).ok());
  ASSERT_TRUE(Generate(*model, {1, 50, 60}, opt, p2, [&](int32_t t) {
                b.push_back(t);
                return true;
              }).ok());
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.size(), 24u);
}

TEST_P(TinyModelTest, LogitsAreFiniteAndInputDependent) {
  auto model = Load();
  const int32_t V = model->config().n_vocab;
  ThreadPool pool(1);
  SingleSequence f(*model, pool, 16);
  std::vector<float> a(V), b(V);
  int32_t t1[] = {1, 10}, t2[] = {1, 11};
  ASSERT_TRUE(f.Run(t1, 2, 0, 1, a.data()).ok());
  ASSERT_TRUE(f.Run(t2, 2, 0, 1, b.data()).ok());
  double diff = 0;
  for (int32_t v = 0; v < V; ++v) {
    ASSERT_TRUE(std::isfinite(a[v]));
    diff += std::fabs(a[v] - b[v]);
  }
  EXPECT_GT(diff, 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Archs, TinyModelTest,
                         ::testing::Values(ArchCase{"llama", DType::kF32, false, 16},
                                           ArchCase{"llama", DType::kF16, true, 16},
                                           ArchCase{"llama", DType::kBF16, false, 16},
                                           ArchCase{"llama", DType::kQ8_0, false, 16},
                                           ArchCase{"llama", DType::kQ4_0, false, 16},
                                           ArchCase{"qwen2", DType::kF32, true, 16},
                                           ArchCase{"qwen2", DType::kQ8_0, true, 16},
                                           ArchCase{"qwen3", DType::kF32, true, 32},
                                           ArchCase{"qwen3", DType::kF16, true, 32}),
                         [](const auto& info) {
                           return std::string(info.param.arch) + "_" +
                                  std::string(DTypeName(info.param.type)) +
                                  (info.param.tied ? "_tied" : "");
                         });

std::vector<float> LastLogits(gguf::Writer w, const std::vector<int32_t>& tokens) {
  auto f = gguf::File::FromBytes(w.Serialize());
  auto model = Model::FromFile(std::move(*f));
  EXPECT_TRUE(model.ok()) << model.error();
  ThreadPool pool(1);
  SingleSequence fwd(**model, pool, 32);
  std::vector<float> logits((*model)->config().n_vocab);
  EXPECT_TRUE(
      fwd.Run(tokens.data(), static_cast<int32_t>(tokens.size()), 0, 1, logits.data()).ok());
  return logits;
}

// Llama 3 style models carry per-frequency RoPE divisors in rope_freqs.weight.
TEST(RopeFreqs, FactorsOfOneChangeNothingAndOthersDo) {
  testing::TinyModelSpec spec;
  const std::vector<int32_t> tokens = {1, 30, 31, 32, 33, 34, 35, 36};
  std::vector<float> plain = LastLogits(testing::MakeTinyModelWriter(spec), tokens);
  gguf::Writer ones = testing::MakeTinyModelWriter(spec);
  ones.AddTensorF32("rope_freqs.weight", {static_cast<uint64_t>(spec.head_dim / 2)}, DType::kF32,
                    std::vector<float>(spec.head_dim / 2, 1.f));
  std::vector<float> with_ones = LastLogits(std::move(ones), tokens);
  gguf::Writer scaled = testing::MakeTinyModelWriter(spec);
  scaled.AddTensorF32("rope_freqs.weight", {static_cast<uint64_t>(spec.head_dim / 2)}, DType::kF32,
                      std::vector<float>(spec.head_dim / 2, 8.f));
  std::vector<float> with_scaled = LastLogits(std::move(scaled), tokens);
  double same = 0, changed = 0;
  for (size_t v = 0; v < plain.size(); ++v) {
    same = std::max(same, std::fabs(double(plain[v]) - with_ones[v]));
    changed = std::max(changed, std::fabs(double(plain[v]) - with_scaled[v]));
  }
  EXPECT_EQ(same, 0.0);
  EXPECT_GT(changed, 1e-3);
}

TEST(ForwardErrors, RejectsBadTokensAndFullContext) {
  testing::TinyModelSpec spec;
  auto f = gguf::File::FromBytes(testing::MakeTinyModel(spec));
  auto model = Model::FromFile(std::move(*f));
  ASSERT_TRUE(model.ok());
  ThreadPool pool(1);
  SingleSequence fwd(**model, pool, 4);
  std::vector<float> logits((*model)->config().n_vocab);
  int32_t bad[] = {1, 100000};
  auto st = fwd.Run(bad, 2, 0, 1, logits.data());
  EXPECT_NE(st.message().find("outside the vocabulary"), std::string::npos) << st.message();
  int32_t ok[] = {1, 2, 3};
  st = fwd.Run(ok, 3, 2, 1, logits.data());
  EXPECT_NE(st.message().find("context full"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace kvs
