// A fake model for engine and scheduler tests without weights: the next token is a hash of
// every token before it, so a sequence's output depends on all of its history (a recompute
// after preemption, or a rolled-back draft, must reproduce it exactly). With the helpers the
// tests around it share: greedy requests, prompts, the expected output, collecting events.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"
#include "engine/step_batch.h"
#include "engine/step_sampler.h"

namespace kvs::testing {

inline constexpr int32_t kVocab = 64;

// The token after tokens[0, n); never 0 or 1 (the tests' stop tokens).
inline int32_t NextToken(const std::vector<int32_t>& tokens, size_t n) {
  uint32_t h = 17;
  for (size_t i = 0; i < n; ++i) h = h * 31 + static_cast<uint32_t>(tokens[i]);
  return static_cast<int32_t>(h % (kVocab - 2)) + 2;
}

// What a runner knows of the sequences from the steps alone (step_batch.h): each one's tokens
// and block table, kept as the batches say. The fakes read histories from here, never from
// the engine, so that the plain-data step is what the tests exercise.
class RunnerMirror {
 public:
  void Apply(const StepBatch& step) {
    for (int64_t seq : step.released) {
      EXPECT_TRUE(sequences_.erase(seq) > 0) << "released " << seq << ", which was never sent";
    }
    for (const StepNewSequence& s : step.new_sequences) {
      EXPECT_FALSE(sequences_.contains(s.seq)) << "sequence " << s.seq << " sent as new twice";
      sequences_[s.seq].tokens = s.tokens;
    }
    for (const StepRun& r : step.runs) {
      auto it = sequences_.find(r.seq);
      EXPECT_TRUE(it != sequences_.end()) << "a run of unknown sequence " << r.seq;
      if (it == sequences_.end()) continue;
      State& st = it->second;
      EXPECT_EQ(r.tables.size(), 1u) << "one KV group";
      if (r.tables.empty()) continue;
      EXPECT_LE(r.tables[0].keep, static_cast<int32_t>(st.table.size()));
      ApplyTableDelta(r.tables[0], &st.table);
      const size_t end = static_cast<size_t>(r.first_position) + r.n_tokens;
      if (st.tokens.size() < end) st.tokens.resize(end);
      std::copy_n(step.tokens.begin() + r.first_token, r.n_tokens,
                  st.tokens.begin() + r.first_position);
      // A fork starts with its parent's tokens (this run's end) and no table of its own.
      for (const StepFork& f : r.forks) {
        EXPECT_FALSE(sequences_.contains(f.seq)) << "fork " << f.seq << " is known already";
        sequences_[f.seq].tokens.assign(st.tokens.begin(), st.tokens.begin() + end);
      }
    }
  }
  // Every token's slot in the batch is slot n_cached + i of its sequence's table as the deltas
  // rebuilt it: a wrong delta (preemption, a prefix hit, a fork, a rollback) fails here.
  void ExpectSlotsMatchTables(const StepBatch& step) const {
    for (const StepRun& r : step.runs) {
      const std::vector<BlockId>& t = table(r.seq);
      for (int32_t i = 0; i < r.n_tokens; ++i) {
        const int32_t slot = r.n_cached + i;
        ASSERT_LT(static_cast<size_t>(slot / step.block_size), t.size());
        EXPECT_EQ(step.slots[0][r.first_token + i],
                  static_cast<int64_t>(t[slot / step.block_size].value) * step.block_size +
                      slot % step.block_size)
            << "sequence " << r.seq << " slot " << slot;
      }
    }
  }
  const std::vector<int32_t>& tokens(int64_t seq) const { return sequences_.at(seq).tokens; }
  const std::vector<BlockId>& table(int64_t seq) const { return sequences_.at(seq).table; }
  size_t size() const { return sequences_.size(); }

 private:
  struct State {
    std::vector<int32_t> tokens;
    std::vector<BlockId> table;
  };
  std::unordered_map<int64_t, State> sequences_;
};

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
