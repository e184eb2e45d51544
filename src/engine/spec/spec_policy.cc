#include "engine/spec/spec_policy.h"

#include <algorithm>
#include <cmath>

namespace kvs {

Status SpecConfig::Validate() const {
  if (draft_max < 1 || draft_max > 32) {
    return Status::Error(StrFormat(
        "--draft-max %d: must be between 1 and 32 (use --spec-type none to turn speculation off)",
        draft_max));
  }
  if (draft_min < 0 || draft_min > draft_max) {
    return Status::Error(
        StrFormat("--draft-min %d: must be between 0 and --draft-max (%d)", draft_min, draft_max));
  }
  return Status::Ok();
}

double SpecPolicy::Gain(double a, int32_t k, double draft_cost, double kv_share) const {
  a = std::clamp(a, 0.0, 0.999);
  const double tokens = (1.0 - std::pow(a, k + 1)) / (1.0 - a);
  return tokens / (1.0 + k * (draft_cost + config_.verify_cost_per_token + kv_share));
}

int32_t SpecPolicy::Choose(const SpecState& state, int32_t k_cap, double draft_cost,
                           double kv_share) const {
  const int32_t k_max = std::min(config_.draft_max, std::max(0, k_cap));
  int32_t best_k = 0;
  double best = config_.min_gain;
  for (int32_t k = 1; k <= k_max; ++k) {
    const double g = Gain(state.acceptance, k, draft_cost, kv_share);
    if (g > best) best = g, best_k = k;
  }
  // A sequence left out for a while drafts once more, so that a stale low estimate (text that
  // turned repetitive, say) can recover.
  if (best_k == 0 && k_max >= 1 && state.idle_steps >= state.probe_after) best_k = 1;
  return std::max(best_k, config_.draft_min);
}

void SpecPolicy::Record(SpecState* state, int32_t n_drafted, int32_t n_accepted) {
  if (n_drafted <= 0) return;
  // Drafts are tested in order until the first rejection: a accepted of k means a + 1 tests
  // (a when all passed), each passing with the per-draft acceptance the gain model uses.
  const int32_t tested = n_accepted + (n_accepted < n_drafted ? 1 : 0);
  const double rate = static_cast<double>(n_accepted) / tested;
  // Weighted by the tests seen, so one long round counts for more than one short one.
  const double w = 1.0 - std::pow(0.85, tested);
  state->acceptance += w * (rate - state->acceptance);
  // A sequence whose drafts keep failing (a context a windowed draft cannot follow) is probed
  // ever more rarely: each probe costs a draft pass for nothing.
  state->probe_after = n_accepted == 0 ? std::min(2 * state->probe_after, 1024) : 32;
}

}  // namespace kvs
