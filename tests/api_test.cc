// The public API's token streams (include/kvserve/kvserve.h): callbacks run off the engine's
// loop, in order per request, and all of them have run when ~Engine returns.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "kvserve/kvserve.h"
#include "testing/test_models.h"

namespace {

struct Recorded {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> tokens;
  std::string text;
  int ends = 0;
  std::string finish_reason;
};

class ApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = kvs::testing::TestModelPath("stories260K.gguf");
    if (path.empty()) GTEST_SKIP() << "stories260K.gguf not found (set KVSERVE_TEST_MODELS)";
    std::string error;
    model_ = kvserve::Model::Load(path, &error);
    ASSERT_TRUE(model_) << error;
    kvserve::EngineOptions o;
    o.n_ctx = 512;
    o.n_parallel = 2;
    o.threads = 1;
    engine_ = kvserve::Engine::Start(model_, o, &error);
    ASSERT_TRUE(engine_) << error;
  }
  kvserve::GenerationOptions Greedy(int32_t max_tokens) {
    kvserve::GenerationOptions g;
    g.temperature = 0;
    g.max_tokens = max_tokens;
    g.ignore_eos = true;
    return g;
  }
  std::shared_ptr<kvserve::Model> model_;
  std::unique_ptr<kvserve::Engine> engine_;
};

// A callback that blocks does not hold up the engine: steps go on while it waits (before, the
// callback ran inside the step and the loop waited for it), and the tokens still arrive in
// order, with text that is the detokenized ids.
TEST_F(ApiTest, BlockedCallbackDoesNotStallTheLoop) {
  Recorded r;
  std::mutex gate_mu;
  std::condition_variable gate_cv;
  bool first_seen = false, released = false;
  int64_t steps_at_first = 0;
  kvserve::Engine* engine = engine_.get();
  std::string error;
  const uint64_t id = engine_->Submit(
      model_->Tokenize("Once upon a time"), Greedy(48),
      [&](const kvserve::TokenEvent& e) {
        {
          std::unique_lock<std::mutex> lock(gate_mu);
          if (!first_seen) {
            first_seen = true;
            steps_at_first = engine->stats().steps;
            gate_cv.notify_all();
            gate_cv.wait(lock, [&] { return released; });
          }
        }
        std::lock_guard<std::mutex> lock(r.mu);
        if (e.token >= 0) r.tokens.push_back(e.token);
        r.text += e.text;
        if (e.finished) {
          ++r.ends;
          r.finish_reason = e.finish_reason;
        }
        r.cv.notify_all();
      },
      &error);
  ASSERT_NE(id, 0u) << error;
  {
    std::unique_lock<std::mutex> lock(gate_mu);
    gate_cv.wait(lock, [&] { return first_seen; });
  }
  // The loop keeps stepping while the first callback is held.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (engine_->stats().steps < steps_at_first + 10 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  EXPECT_GE(engine_->stats().steps, steps_at_first + 10);
  {
    std::lock_guard<std::mutex> lock(gate_mu);
    released = true;
  }
  gate_cv.notify_all();
  std::unique_lock<std::mutex> lock(r.mu);
  r.cv.wait(lock, [&] { return r.ends == 1; });
  EXPECT_EQ(r.finish_reason, "length");
  ASSERT_EQ(r.tokens.size(), 48u);
  EXPECT_EQ(r.text, model_->Detokenize(r.tokens));
}

// ~Engine cancels what still runs and returns only after every callback ran, the ends
// included; a callback may call Cancel.
TEST_F(ApiTest, EveryEndIsDeliveredBeforeTheEngineIsGone) {
  Recorded r;
  std::string error;
  kvserve::Engine* engine = engine_.get();
  std::vector<uint64_t> ids;
  for (int i = 0; i < 3; ++i) {
    kvserve::GenerationOptions g = Greedy(-1);
    g.n = 2;
    ids.push_back(engine_->Submit(
        model_->Tokenize("Once upon a time"), g,
        [&r, engine, i](const kvserve::TokenEvent& e) {
          std::lock_guard<std::mutex> lock(r.mu);
          if (e.token >= 0) r.tokens.push_back(e.token);
          if (e.finished) ++r.ends;
          // The first request cancels itself from its own callback after a few tokens.
          if (i == 0 && e.token >= 0 && r.tokens.size() == 3) engine->Cancel(e.request);
          r.cv.notify_all();
        },
        &error));
    ASSERT_NE(ids.back(), 0u) << error;
  }
  {
    std::unique_lock<std::mutex> lock(r.mu);
    r.cv.wait(lock, [&] { return r.tokens.size() >= 8; });
  }
  engine_.reset();
  std::lock_guard<std::mutex> lock(r.mu);
  EXPECT_EQ(r.ends, 6);  // three requests of two choices
}

}  // namespace
