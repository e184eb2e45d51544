// A model whose layers attend differently (sliding-window and global layers, as Gemma 3's): the
// file names its local layers, the model has two KV cache groups, and the engine (a block table
// per group, the window's blocks going back to the pool as sequences grow, prefix hits under the
// window's rule, preemption) computes what one sequence over a plain cache computes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <vector>

#include "engine/engine.h"
#include "engine/engine_builder.h"
#include "model/config.h"
#include "model/weights.h"
#include "testing/tiny_model.h"

namespace kvs::kv_group_model_test {
namespace {

constexpr int32_t kLayers = 4;

// A tiny llama (random weights, the same for every window) with attention.sliding_window =
// window and attention.sliding_window_pattern = pattern (window 0: neither key).
std::unique_ptr<Model> TinyModel(uint32_t window, uint32_t pattern) {
  testing::TinyModelSpec spec;
  spec.n_layer = kLayers;
  spec.n_ctx = 512;
  gguf::Writer w = testing::MakeTinyModelWriter(spec);
  if (window > 0) {
    w.Set("llama.attention.sliding_window", gguf::Value::Uint32(window));
    w.Set("llama.attention.sliding_window_pattern", gguf::Value::Uint32(pattern));
  }
  auto f = gguf::File::FromBytes(w.Serialize());
  EXPECT_TRUE(f.ok()) << f.error();
  if (!f.ok()) return nullptr;
  auto model = Model::FromFile(std::move(*f));
  EXPECT_TRUE(model.ok()) << model.error();
  return model.ok() ? std::move(*model) : nullptr;
}

std::vector<int32_t> Prompt(int32_t n, int32_t salt) {
  std::vector<int32_t> t = {1};
  for (int32_t i = 1; i < n; ++i) t.push_back(3 + (i * 7 + salt * 13) % 250);
  return t;
}

// The last position's logits after the whole text, through one sequence over a plain cache
// (one table that every group reads: nothing freed before a window).
std::vector<float> LastLogits(const Model& model, const std::vector<int32_t>& tokens) {
  ThreadPool pool(2);
  EngineBuilder builder(model, nullptr, pool);
  auto single = builder.Single(256);
  EXPECT_TRUE(single.ok()) << single.error();
  std::vector<float> out(static_cast<size_t>(model.config().n_vocab));
  if (!single.ok()) return out;
  EXPECT_TRUE(
      (*single)->Run(tokens.data(), static_cast<int32_t>(tokens.size()), 0, 1, out.data()).ok());
  return out;
}

// Greedy tokens after prompt, one at a time through one sequence over a plain cache.
std::vector<int32_t> GreedyReference(const Model& model, const std::vector<int32_t>& prompt,
                                     int32_t n) {
  ThreadPool pool(2);
  EngineBuilder builder(model, nullptr, pool);
  auto single = builder.Single(256);
  EXPECT_TRUE(single.ok()) << single.error();
  if (!single.ok()) return {};
  std::vector<float> logits(static_cast<size_t>(model.config().n_vocab));
  std::vector<int32_t> out;
  EXPECT_TRUE(
      (*single)->Run(prompt.data(), static_cast<int32_t>(prompt.size()), 0, 1, logits.data()).ok());
  int32_t pos = static_cast<int32_t>(prompt.size());
  for (int32_t i = 0; i < n; ++i) {
    const int32_t t =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(t);
    if (i + 1 < n) EXPECT_TRUE((*single)->Run(&t, 1, pos++, 1, logits.data()).ok());
  }
  return out;
}

double MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(double(a[i]) - b[i]));
  return d;
}

TEST(KvGroupModel, TheFileNamesTheLocalLayersAndEachKindOfAttentionIsAGroup) {
  // Pattern 2: every second layer global (llama.cpp's set_swa_pattern), the others local.
  auto model = TinyModel(24, 2);
  ASSERT_NE(model, nullptr);
  const ModelConfig& c = model->config();
  ASSERT_EQ(c.kv_groups.size(), 2u);
  EXPECT_EQ(c.kv_groups[0], KvGroupSpec{0});  // global first
  EXPECT_EQ(c.kv_groups[1], KvGroupSpec{24});
  for (int32_t l = 0; l < kLayers; ++l) {
    const bool local = l % 2 == 0;
    EXPECT_EQ(c.layers[l].attention, local ? AttentionKind::kSliding : AttentionKind::kGlobal) << l;
    EXPECT_EQ(c.layers[l].window, local ? 24 : 0) << l;
    EXPECT_EQ(c.layers[l].kv_group, local ? 1 : 0) << l;
    EXPECT_EQ(c.layers[l].kv_slab, l / 2) << l;  // layers 0 and 2 local, 1 and 3 global
  }
  EXPECT_EQ(c.kv_slabs(), 2);
  // Without a window every layer is global: one group.
  auto plain = TinyModel(0, 0);
  ASSERT_NE(plain, nullptr);
  ASSERT_EQ(plain->config().kv_groups.size(), 1u);
  EXPECT_EQ(plain->config().kv_groups[0], KvGroupSpec{0});
  EXPECT_EQ(plain->config().kv_slabs(), kLayers);
  // Three local layers to one global: the kinds cut into groups of the smaller kind's size.
  auto uneven = TinyModel(24, 4);
  ASSERT_NE(uneven, nullptr);
  const ModelConfig& u = uneven->config();
  ASSERT_EQ(u.kv_groups.size(), 4u);
  EXPECT_EQ(u.kv_groups[0], KvGroupSpec{0});
  for (int32_t g = 1; g < 4; ++g) EXPECT_EQ(u.kv_groups[g], KvGroupSpec{24});
  EXPECT_EQ(u.layers[3].kv_group, 0);
  for (int32_t l = 0; l < 3; ++l) EXPECT_EQ(u.layers[l].kv_group, l + 1);
  EXPECT_EQ(u.kv_slabs(), 1);
}

TEST(KvGroupModel, AWindowWiderThanTheTextChangesNothingAndANarrowOneDoes) {
  auto plain = TinyModel(0, 0);
  auto wide = TinyModel(256, 2);
  auto narrow = TinyModel(8, 2);
  ASSERT_TRUE(plain && wide && narrow);
  const std::vector<int32_t> text = Prompt(60, 1);
  const std::vector<float> a = LastLogits(*plain, text);
  EXPECT_EQ(MaxDiff(a, LastLogits(*wide, text)), 0.0);
  EXPECT_GT(MaxDiff(a, LastLogits(*narrow, text)), 1e-3);
}

// Four requests sharing a 40-token prefix, each 60 tokens past it and generating 70 more: well
// past a 24-token window, so the local group's early blocks go back to the pool; a pool too small
// for all four at once preempts; chunks of 32 tokens prefill them; the later ones hit the
// prefix cache. Every output is the one-sequence reference's.
// With pattern 2 the two kinds have two layers each: two groups, two slabs. With pattern 4 three
// local layers and a global one: four groups of one layer (vLLM's rule: groups as large as the
// smallest kind), one slab that every group's blocks share, so the pool's memory holds a block of
// one layer per block id.
void ExpectTheEngineComputesWhatOneSequenceDoes(uint32_t pattern, int32_t n_blocks,
                                                int32_t n_groups) {
  auto model = TinyModel(24, pattern);
  ASSERT_NE(model, nullptr);
  ThreadPool pool(2);
  EngineBuilder builder(*model, nullptr, pool);
  EngineConfig ec;
  ec.n_ctx = 256;
  ec.max_seqs = 4;
  ec.max_batch_tokens = 32;
  ec.max_step_ms = 0;
  ec.block_size = 16;
  ec.n_blocks = n_blocks;
  ec.watermark_blocks = 0;
  ec.verify_each_step = true;
  auto local = builder.Local(ec);
  ASSERT_TRUE(local.ok()) << local.error();
  Engine& engine = *local->engine;
  EXPECT_EQ(engine.kv().num_groups(), n_groups);
  EXPECT_EQ(local->runner->storage().num_slabs(), kLayers / n_groups);

  const std::vector<int32_t> shared = Prompt(40, 0);
  std::map<RequestId, std::vector<int32_t>> prompts, outputs;
  for (int32_t r = 0; r < 4; ++r) {
    std::vector<int32_t> prompt = shared;
    const std::vector<int32_t> rest = Prompt(61, r + 1);
    prompt.insert(prompt.end(), rest.begin() + 1, rest.end());
    RequestOptions o;
    o.sampling.temperature = 0;
    o.max_tokens = 70;
    auto id = engine.Submit(prompt, o, [&outputs](const TokenEvent& e) {
      if (e.token >= 0) outputs[e.request].push_back(e.token);
    });
    ASSERT_TRUE(id.ok()) << id.error();
    prompts[*id] = prompt;
  }
  int32_t released_local = 0;
  int64_t preempted = 0;
  while (engine.HasWork()) {
    EngineStepStats stats;
    ASSERT_TRUE(engine.Step(&stats).ok());
    preempted += stats.n_preempted;
    for (const Sequence* seq : engine.scheduler().running()) {
      const std::vector<BlockId>& t = engine.kv().Table(seq->id, 1).blocks;
      released_local = std::max<int32_t>(
          released_local, static_cast<int32_t>(std::count(t.begin(), t.end(), kNullBlock)));
    }
  }
  EXPECT_GT(released_local, 0) << "the local group never gave a block back";
  EXPECT_GT(preempted, 0) << "the pool was meant to be too small for all four";
  EXPECT_GT(engine.scheduler().prefix_hits(), 0);
  for (const auto& [id, prompt] : prompts) {
    EXPECT_EQ(outputs[id], GreedyReference(*model, prompt, 70)) << "request " << id;
  }
}

// A full-context sequence needs 11 global blocks and at most 6 in each local group.
TEST(KvGroupModel, TheEngineComputesWhatOneSequenceDoes) {
  ExpectTheEngineComputesWhatOneSequenceDoes(2, 1 + 26, 2);
}

TEST(KvGroupModel, GroupsThatShareOneSlabComputeWhatOneSequenceDoes) {
  ExpectTheEngineComputesWhatOneSequenceDoes(4, 1 + 40, 4);
}

// Token eviction on model, refused with groups_text in the builder's message, and a request's
// kv_budget refused too.
void ExpectEvictionRefused(const Model& model, const std::string& groups_text) {
  ThreadPool pool(1);
  EngineConfig ec;
  ec.n_ctx = 128;
  ec.n_blocks = 64;
  ec.eviction.budget.value = 64;
  auto local = EngineBuilder(model, nullptr, pool).Local(ec);
  ASSERT_FALSE(local.ok());
  EXPECT_NE(local.error().find("token eviction (--kv-budget) does not work yet with a model that "
                               "has sliding-window layers (" +
                               groups_text + ")"),
            std::string::npos)
      << local.error();
  ec.eviction.budget = {};
  auto ok = EngineBuilder(model, nullptr, pool).Local(ec);
  ASSERT_TRUE(ok.ok()) << ok.error();
  RequestOptions o;
  o.kv_budget.value = 64;
  const Status st = ok->engine->ValidateRequest(Prompt(10, 0), o);
  EXPECT_NE(st.message().find("kv_budget: token eviction does not work yet"), std::string::npos)
      << st.message();
}

TEST(KvGroupModel, WhatDoesNotKnowGroupsYetIsRefusedByName) {
  auto model = TinyModel(24, 2);
  ASSERT_NE(model, nullptr);
  ExpectEvictionRefused(*model, "2 KV cache groups");
}

// Every layer local (pattern 0): one KV cache group, a sliding one, refused as two are.
TEST(KvGroupModel, AModelOfOnlySlidingLayersIsRefusedWhatWindowsDoNotWorkWithYet) {
  auto model = TinyModel(24, 0);
  ASSERT_NE(model, nullptr);
  ASSERT_EQ(model->config().kv_groups.size(), 1u);
  EXPECT_TRUE(model->config().kv_groups[0].sliding());
  ExpectEvictionRefused(*model, "1 KV cache group");
}

TEST(KvGroupModel, APatternArrayOfAnotherTypeIsRefusedNamingIt) {
  testing::TinyModelSpec spec;
  spec.n_layer = kLayers;
  gguf::Writer w = testing::MakeTinyModelWriter(spec);
  w.Set("llama.attention.sliding_window", gguf::Value::Uint32(24));
  w.Set("llama.attention.sliding_window_pattern", gguf::Value::Float32Array({1.f, 0.f, 1.f, 0.f}));
  auto f = gguf::File::FromBytes(w.Serialize());
  ASSERT_TRUE(f.ok()) << f.error();
  auto model = Model::FromFile(std::move(*f));
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.error().find("'llama.attention.sliding_window_pattern' is an array of"),
            std::string::npos)
      << model.error();
}

}  // namespace
}  // namespace kvs::kv_group_model_test
