// What a step costs: its wall time as a + b·tokens, fitted over the steps the engine ran by
// exponentially weighted least squares (recent steps weigh most: this machine's speed drifts by
// ±20% within minutes). Stall-free batching (Sarathi-Serve) asks it how many tokens fit in the
// step-time target while sequences decode. Pure arithmetic on the observations it is given, so
// tests feed it their own clock.
#pragma once

#include <cstdint>

namespace kvs {

class StepCostModel {
 public:
  // forget: the weight each older observation keeps per new one (0.9: the last ~10 steps count).
  explicit StepCostModel(double forget = 0.9) : forget_(forget) {}

  // A step computed n_tokens in `seconds`. Once the model is ready an observation counts for at
  // most 3× its prediction: one slow step (page faults, a draft model catching up, the VM
  // stalling) must not cut prompts to the floor for the next dozens of steps.
  void Observe(int32_t n_tokens, double seconds);
  bool ready() const { return s1_ > 0; }
  // The fitted a (seconds) and b (seconds per token); {0, 0} before any observation.
  double intercept() const;
  double per_token() const;
  // The most tokens a step may compute to take at most `seconds`: 0 when even one does not fit
  // or before any observation; kUnlimited when the steps observed took no time at all.
  int32_t TokensWithin(double seconds) const;
  static constexpr int32_t kUnlimited = 1 << 30;
  // a / b rounded: the tokens whose time equals a step's fixed cost; 0 before any observation,
  // or when the fit shows no fixed cost or no cost per token (the scheduler then sets no limit).
  int32_t OverheadTokens() const;

 private:
  struct Fit {
    double a = 0, b = 0;
  };
  Fit Solve() const;

  double forget_;
  // Weighted sums: Σw, Σw·n, Σw·n², Σw·t, Σw·n·t.
  double s0_ = 0, s1_ = 0, s2_ = 0, t1_ = 0, t2_ = 0;
};

}  // namespace kvs
