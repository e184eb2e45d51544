#include "engine/spec/rejection_sampler.h"

namespace kvs {

namespace {
float ProbOf(std::span<const TokenProb> probs, int32_t token) {
  for (const TokenProb& tp : probs) {
    if (tp.id == token) return tp.p;
  }
  return 0.f;
}
}  // namespace

VerifyResult VerifyDrafts(Sampler& sampler, const float* logits, int32_t n_vocab,
                          std::span<const int32_t> history, std::span<const int32_t> drafts,
                          std::span<const std::vector<TokenProb>> q) {
  const bool greedy = sampler.params().temperature <= 0.f;
  const int32_t k = static_cast<int32_t>(drafts.size());
  // q as a dense vector while the residual is formed: p may list the whole vocabulary (top-k
  // off), and a scan of q per entry of p would be quadratic.
  thread_local std::vector<float> dense_q;
  thread_local std::vector<TokenProb> residual;
  for (int32_t i = 0; i <= k; ++i) {
    const float* row = logits + static_cast<size_t>(i) * n_vocab;
    const std::span<const TokenProb> p = sampler.Distribution(row, history, drafts.first(i));
    if (i == k) return {k, greedy ? p[0].id : sampler.Draw(p)};
    const int32_t d = drafts[i];
    if (greedy) {
      if (d == p[0].id) continue;
      return {i, p[0].id};
    }
    const bool point_mass = q.empty() || q[i].empty();
    const float qd = point_mass ? 1.f : ProbOf(q[i], d);
    const float pd = ProbOf(p, d);
    // Accept with probability min(1, p(d) / q(d)); a draft its own distribution gave q(d) = 0
    // (a drafter's bug) is never accepted.
    if (qd > 0 && sampler.Uniform() * qd < pd) continue;
    residual.clear();
    if (point_mass) {
      for (const TokenProb& tp : p) {
        if (tp.id != d) residual.push_back(tp);  // max(0, p - 1) at d is 0
      }
    } else {
      dense_q.assign(n_vocab, 0.f);
      for (const TokenProb& tq : q[i]) {
        if (tq.id >= 0 && tq.id < n_vocab) dense_q[tq.id] = tq.p;
      }
      for (const TokenProb& tp : p) {
        const float r = tp.p - dense_q[tp.id];
        if (r > 0) residual.push_back({tp.id, r});
      }
    }
    // The residual is empty only when p <= q everywhere, i.e. p == q up to rounding, where a
    // rejection has probability ~0; p itself is then the right distribution.
    return {i, residual.empty() ? sampler.Draw(p) : sampler.Draw(residual)};
  }
  return {k, -1};  // not reached
}

}  // namespace kvs
