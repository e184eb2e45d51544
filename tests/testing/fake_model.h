// A fake model for engine and scheduler tests without weights: the next token is a hash of
// every token before it, so a sequence's output depends on all of its history (a recompute
// after preemption, or a rolled-back draft, must reproduce it exactly). With the helpers the
// tests around it share: greedy requests, prompts, the expected output, collecting events.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <vector>

#include "engine/engine.h"

namespace kvs::testing {

inline constexpr int32_t kVocab = 64;

// The token after tokens[0, n); never 0 or 1 (the tests' stop tokens).
inline int32_t NextToken(const std::vector<int32_t>& tokens, size_t n) {
  uint32_t h = 17;
  for (size_t i = 0; i < n; ++i) h = h * 31 + static_cast<uint32_t>(tokens[i]);
  return static_cast<int32_t>(h % (kVocab - 2)) + 2;
}

inline std::vector<int32_t> Prompt(int32_t n, int32_t seed) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < n; ++i) p.push_back(2 + (seed * 7 + i * 3) % (kVocab - 2));
  return p;
}

// What a request produces alone, without any batching: the fake model token by token.
inline std::vector<int32_t> ExpectedOutput(std::vector<int32_t> tokens, int32_t n_out) {
  std::vector<int32_t> out;
  for (int32_t i = 0; i < n_out; ++i) {
    out.push_back(NextToken(tokens, tokens.size()));
    tokens.push_back(out.back());
  }
  return out;
}

inline RequestOptions Greedy(int32_t max_tokens, int32_t n = 1) {
  RequestOptions o;
  o.sampling.temperature = 0;
  o.max_tokens = max_tokens;
  o.n = n;
  return o;
}

// A request's streamed tokens and finish reasons, per choice.
struct Collected {
  std::map<int32_t, std::vector<int32_t>> tokens;
  std::map<int32_t, FinishReason> finish;
};

inline RequestId Submit(Engine& e, std::vector<int32_t> prompt, const RequestOptions& o,
                        Collected* c) {
  auto id = e.Submit(std::move(prompt), o, [c](const TokenEvent& ev) {
    if (ev.token >= 0) c->tokens[ev.choice].push_back(ev.token);
    if (ev.finished) c->finish[ev.choice] = ev.reason;
  });
  EXPECT_TRUE(id.ok()) << id.error();
  return id.ok() ? *id : -1;
}

inline void RunToEnd(Engine& e, int max_steps = 2000) {
  for (int i = 0; i < max_steps && e.HasWork(); ++i) ASSERT_TRUE(e.Step().ok());
  ASSERT_FALSE(e.HasWork()) << "still running after " << max_steps << " steps";
}

}  // namespace kvs::testing
