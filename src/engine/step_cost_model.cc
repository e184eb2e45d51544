#include "engine/step_cost_model.h"

#include <algorithm>
#include <cmath>

namespace kvs {

void StepCostModel::Observe(int32_t n_tokens, double seconds) {
  if (n_tokens <= 0 || !(seconds >= 0) || !std::isfinite(seconds)) return;
  const double n = n_tokens;
  if (ready()) {
    const Fit fit = Solve();
    const double predicted = fit.a + fit.b * n;
    if (predicted > 0) seconds = std::min(seconds, 3 * predicted);
  }
  s0_ = forget_ * s0_ + 1;
  s1_ = forget_ * s1_ + n;
  s2_ = forget_ * s2_ + n * n;
  t1_ = forget_ * t1_ + seconds;
  t2_ = forget_ * t2_ + n * seconds;
}

StepCostModel::Fit StepCostModel::Solve() const {
  Fit fit;
  if (s1_ <= 0) return fit;
  // The weighted variance of the step sizes: below a token² the steps were all one size and
  // only their average cost per token is known (a = 0 then over-predicts small steps, which
  // errs on the side of shorter steps).
  const double mean = s1_ / s0_;
  const double variance = s2_ / s0_ - mean * mean;
  if (variance >= 1.0) {
    fit.b = (s0_ * t2_ - s1_ * t1_) / (s0_ * s2_ - s1_ * s1_);
    fit.a = (t1_ - fit.b * s1_) / s0_;
  }
  // A fit with a negative cost per token or start (noise over a narrow range of sizes) is
  // replaced by the average cost per token.
  if (!(fit.b > 0) || fit.a < 0) fit = Fit{0, t1_ / s1_};
  return fit;
}

double StepCostModel::intercept() const {
  return Solve().a;
}
double StepCostModel::per_token() const {
  return Solve().b;
}

int32_t StepCostModel::TokensWithin(double seconds) const {
  if (!ready()) return 0;
  const Fit fit = Solve();
  if (!(fit.b > 0)) return kUnlimited;  // every step observed took 0 s (a coarse clock)
  if (seconds <= fit.a) return 0;
  // The epsilon keeps a quotient that is whole up to rounding (0.14 / 0.002) whole.
  const double n = (seconds - fit.a) / fit.b * (1 + 1e-12);
  return static_cast<int32_t>(std::min(n, static_cast<double>(kUnlimited)));
}

int32_t StepCostModel::OverheadTokens() const {
  if (!ready()) return 0;
  const Fit fit = Solve();
  if (!(fit.b > 0) || !(fit.a > 0)) return 0;
  const double n = std::round(fit.a / fit.b);  // below half a token: no fixed cost to speak of
  return static_cast<int32_t>(std::min(n, static_cast<double>(kUnlimited)));
}

}  // namespace kvs
