// Adaptive k: how many drafts a sequence gets this step, so that speculation is never a loss.
//
// A round with k drafts at per-draft acceptance a yields E(k) = (1 - a^(k+1)) / (1 - a) tokens
// (Leviathan et al.) and costs 1 + k * c + k * v target-decode steps: c a drafted token's cost
// (Drafter::relative_cost), v what one more position adds to a verification that is memory-bound
// (its weights are read once for all positions). The policy picks the k that maximizes
// E(k) / cost(k) and speculates only when that beats plain decoding by a margin. Acceptance is
// tracked per sequence (an exponential average of the drafts it accepted). Under load the step
// is compute-bound already: more positions cost their full compute, so while the step's tokens
// exceed `compute_bound_tokens` the policy shrinks k, to 0 when plain decodes fill the budget.
#pragma once

#include <cstdint>

#include "core/status.h"

namespace kvs {

struct SpecConfig {
  int32_t draft_max = 4;  // --draft-max: most drafts per sequence and step
  int32_t draft_min = 0;  // --draft-min: adaptive k never goes below it (>= 1: never switches off)
  // Positions per step up to which a step costs about what a decode does: the float matmul
  // kernel takes up to 6 tokens in one pass over the weights (kFloatFewTokens); past that, on 2
  // Zen 5 cores, each position costs its compute (F16 llama-1b at 4 sequences with one draft
  // each: 27-31 t/s against 67-110 without, bench throughput), and two sequences drafting two
  // each did not pay either. So 1 sequence drafts up to 4 tokens, 2 one each, and 3 or more
  // decoding sequences do not draft.
  int32_t compute_bound_tokens = 5;
  double verify_cost_per_token = 0.06;  // v above, measured (bench spec, docs/BENCHMARKS.md)
  double min_gain = 1.05;               // expected speedup below which a sequence does not draft

  Status Validate() const;
};

// Per-sequence acceptance, kept by the engine with the sequence.
struct SpecState {
  double acceptance = 0.8;   // per-draft acceptance: an average of accepted / tested (optimistic)
  int32_t idle_steps = 0;    // steps since the policy last let it draft
  int32_t probe_after = 32;  // idle steps before it drafts once more to re-measure; doubles
                             // (to 1024) each time such a probe is rejected outright
};

class SpecPolicy {
 public:
  explicit SpecPolicy(const SpecConfig& config) : config_(config) {}

  // k for one sequence; k_cap: the most drafts the step has room for (its share of the positions
  // left before the step turns compute-bound, ComputeRoom).
  // draft_cost: Drafter::relative_cost_at the sequence's context; kv_share: StepRunner::KvShareAt
  // it (what each more verified position costs again in attention).
  int32_t Choose(const SpecState& state, int32_t k_cap, double draft_cost,
                 double kv_share = 0.0) const;
  // Drafts the step can add before it turns compute-bound, given the positions it holds already.
  int32_t ComputeRoom(int32_t step_tokens) const {
    return step_tokens >= config_.compute_bound_tokens ? 0
                                                       : config_.compute_bound_tokens - step_tokens;
  }
  const SpecConfig& config() const { return config_; }
  // Folds a verification's outcome into the sequence's acceptance.
  static void Record(SpecState* state, int32_t n_drafted, int32_t n_accepted);
  // Expected tokens per target step with k drafts at acceptance a (exposed for tests).
  double Gain(double acceptance, int32_t k, double draft_cost, double kv_share = 0.0) const;

 private:
  SpecConfig config_;
};

}  // namespace kvs
