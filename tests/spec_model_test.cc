// Speculative decoding on real trained models: for every drafter (ngram, self, a draft model),
// greedy output is token for token the output without speculation, on stories260K and on
// stories-hd64-3M (which stories260K drafts for: same vocabulary) — alone, 8 sequences batched,
// with chunked prefill, with preemption, with prefix-cache hits, with a windowed self draft and
// with quantized KV types. Each case also checks that drafts were accepted, so that the
// comparison is not vacuous, and that the pool is whole at the end.
#include <gtest/gtest.h>

#include <cctype>
#include <iterator>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_builder.h"
#include "testing/test_models.h"

namespace kvs {
namespace {

struct Outcome {
  std::vector<std::vector<int32_t>> tokens;  // [request][token]
  int32_t preemptions = 0;
  int64_t prefix_hits = 0;
  int64_t drafted = 0, accepted = 0;
};

std::vector<std::vector<int32_t>> Prompts() {
  std::vector<std::vector<int32_t>> prompts;
  const int32_t lengths[] = {1, 5, 17, 9, 33, 2, 24, 12};
  for (int32_t p = 0; p < 8; ++p) {
    std::vector<int32_t> prompt = {1};
    for (int32_t i = 1; i < lengths[p]; ++i) prompt.push_back(3 + (p * 97 + i * 31) % 500);
    prompts.push_back(prompt);
  }
  return prompts;
}

struct Scenario {
  int32_t max_seqs = 8;
  int32_t budget = 512;
  int32_t n_blocks = 160;
  int32_t rounds = 1;
  KvTypes types;
};

Outcome Serve(const Model& model, const SpecOptions& spec, const Scenario& s, int32_t draft_min,
              int32_t max_tokens = 40) {
  ThreadPool pool(2);
  EngineConfig cfg;
  cfg.n_ctx = 256;
  cfg.max_seqs = s.max_seqs;
  cfg.max_batch_tokens = s.budget;
  cfg.n_blocks = s.n_blocks;
  cfg.watermark_blocks = 0;
  cfg.verify_each_step = true;
  cfg.spec.draft_max = 4;
  cfg.spec.draft_min = draft_min;
  EngineBuilder builder(model, nullptr, pool, KvFormatWithTypes(s.types));
  Status st = builder.Speculative(spec);
  EXPECT_TRUE(st.ok()) << st.message();
  auto local = builder.Local(cfg);
  EXPECT_TRUE(local.ok()) << local.error();
  if (!local.ok()) return {};
  Engine& engine = *local->engine;
  const auto prompts = Prompts();
  Outcome out;
  out.tokens.resize(prompts.size());
  for (int32_t round = 0; round < s.rounds; ++round) {
    for (auto& t : out.tokens) t.clear();
    for (size_t i = 0; i < prompts.size(); ++i) {
      RequestOptions o;
      o.sampling.temperature = 0;
      o.max_tokens = max_tokens;
      auto id = engine.Submit(prompts[i], o, [&out, i](const TokenEvent& e) {
        if (e.token >= 0) out.tokens[i].push_back(e.token);
      });
      EXPECT_TRUE(id.ok()) << id.error();
    }
    for (int step = 0; step < 20000 && engine.HasWork(); ++step) {
      EngineStepStats stats;
      EXPECT_TRUE(engine.Step(&stats).ok());
      out.preemptions += stats.n_preempted;
      if (stats.n_tokens > 0) {
        out.prefix_hits = stats.prefix_hits;
        out.drafted = stats.spec_draft_tokens;
        out.accepted = stats.spec_accepted_tokens;
      }
    }
  }
  EXPECT_FALSE(engine.HasWork());
  EXPECT_EQ(engine.kv().num_free_blocks(), engine.kv().num_usable_blocks());
  return out;
}

std::shared_ptr<const Model> Load(const std::string& name) {
  return testing::LoadTestModel(name);
}

const char* const kScenarios[] = {"batched",    "alone",        "chunked prefill",
                                  "preemption", "prefix cache", "quantized KV"};

Scenario MakeScenario(const Model& target, const std::string& name) {
  Scenario s;
  if (name == "alone") s.max_seqs = 1;
  if (name == "chunked prefill") s.budget = 7;
  if (name == "preemption")
    s.n_blocks = 12;  // 11 blocks of 16 for 8 sequences of up to 72 positions
  if (name == "prefix cache") s.rounds = 2;
  if (name == "quantized KV") {
    s.types = {KvType::kQ8_0, KvType::kQ4_0};
    if (target.config().head_dim_k < 32) s.types = {KvType::kInt8, KvType::kInt8};
  }
  return s;
}

// Every drafter for one target: ngram, self (the whole context, and sinks + a 32-position
// window) and the stories260K draft model (for stories260K itself: a model drafting for itself
// accepts everything).
std::vector<std::pair<std::string, SpecOptions>> Drafters(std::shared_ptr<const Model> draft) {
  std::vector<std::pair<std::string, SpecOptions>> drafters;
  SpecOptions ngram;
  ngram.type = SpecType::kNgram;
  drafters.emplace_back("ngram", ngram);
  for (int32_t window : {0, 32}) {
    SpecOptions self;
    self.type = SpecType::kSelf;
    self.draft_window = window;
    self.draft_weights = CompressedViewOptions{DType::kQ8_0, {}, {}};
    drafters.emplace_back("self, window " + std::to_string(window), self);
  }
  SpecOptions draft_spec;
  draft_spec.type = SpecType::kDraft;
  draft_spec.draft_model = std::move(draft);
  drafters.emplace_back("draft model", std::move(draft_spec));
  return drafters;
}

// One test per (target, scenario), each a ctest test of its own: the output without speculation
// is computed once, and every drafter's greedy output must equal it.
class SpecModelTest : public ::testing::TestWithParam<std::tuple<const char*, int>> {};

TEST_P(SpecModelTest, GreedyOutputIsUnchangedByEveryDrafter) {
  const auto [target_name, scenario_index] = GetParam();
  auto target = Load(target_name);
  auto draft = std::string(target_name) == "stories260K.gguf" ? target : Load("stories260K.gguf");
  if (!target || !draft)
    GTEST_SKIP() << "stories models not found under " << testing::TestModelsDir();
  const std::string name = kScenarios[scenario_index];
  const Scenario setup = MakeScenario(*target, name);
  const Outcome plain = Serve(*target, SpecOptions{}, setup, 0);
  for (const auto& [drafter, spec] : Drafters(draft)) {
    SCOPED_TRACE(std::string(SpecTypeName(spec.type)) + " (" + drafter + "), " + name);
    const Outcome fast = Serve(*target, spec, setup, /*draft_min=*/1);
    EXPECT_EQ(fast.tokens, plain.tokens);
    EXPECT_GT(fast.accepted, 0) << "no draft was accepted: the comparison proves nothing";
    if (setup.n_blocks == 12) {
      EXPECT_GT(fast.preemptions, 0);
    }
    if (setup.rounds == 2) {
      EXPECT_GT(fast.prefix_hits, 0);
    }
    // The adaptive policy (draft_min 0) changes how much is drafted, never the output.
    if (name == "batched") {
      EXPECT_EQ(Serve(*target, spec, setup, 0).tokens, plain.tokens);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, SpecModelTest,
    ::testing::Combine(::testing::Values("stories260K.gguf", "stories-hd64-3M.gguf"),
                       ::testing::Range(0, static_cast<int>(std::size(kScenarios)))),
    [](const ::testing::TestParamInfo<SpecModelTest::ParamType>& info) {
      std::string n =
          std::string(std::get<0>(info.param)) + "_" + kScenarios[std::get<1>(info.param)];
      n = n.substr(0, n.find(".gguf")) + n.substr(n.find(".gguf") + 5);
      for (char& c : n)
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      return n;
    });

TEST(SpecModelRefusal, MismatchedDraftIsRefusedNamingTheMismatch) {
  auto target = Load("stories260K.gguf");
  auto other = Load("random-weights/llama-2-tiny-random.gguf");
  if (!target || !other) GTEST_SKIP() << "models not found under " << testing::TestModelsDir();
  ThreadPool pool(1);
  EngineBuilder builder(*target, nullptr, pool);
  SpecOptions spec;
  spec.type = SpecType::kDraft;
  spec.draft_model = other;
  const Status st = builder.Speculative(spec);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("vocabulary"), std::string::npos) << st.message();
  spec.draft_model = nullptr;
  EXPECT_NE(builder.Speculative(spec).message().find("-md"), std::string::npos);
}

}  // namespace
}  // namespace kvs
