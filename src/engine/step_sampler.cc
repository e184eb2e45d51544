#include "engine/step_sampler.h"

#include <algorithm>
#include <cmath>

#include "engine/spec/rejection_sampler.h"

namespace kvs {

StepSampler::State& StepSampler::Add(int64_t seq, const StepSampling& sampling) {
  State& st = states_[seq];
  st.sampler = std::make_unique<Sampler>(sampling.params, n_vocab_);
  st.logprobs = sampling.logprobs;
  st.history.clear();
  return st;
}

Status StepSampler::Apply(const StepBatch& step) {
  for (int64_t seq : step.released) states_.erase(seq);
  for (const StepNewSequence& s : step.new_sequences) Add(s.seq, s.sampling).history = s.tokens;
  for (const StepRun& r : step.runs) {
    auto it = states_.find(r.seq);
    if (it == states_.end()) {
      return Status::Error(
          StrFormat("step: a run of sequence %lld, which the runner was never sent",
                    static_cast<long long>(r.seq)));
    }
    std::vector<int32_t>& history = it->second.history;
    if (r.first_token < 0 || r.n_tokens < 0 ||
        static_cast<int64_t>(r.first_token) + r.n_tokens > step.n_tokens()) {
      return Status::Error(StrFormat("step: sequence %lld's run lies outside the batch's tokens",
                                     static_cast<long long>(r.seq)));
    }
    if (r.first_position < 0 || static_cast<size_t>(r.first_position) > history.size()) {
      return Status::Error(
          StrFormat("step: sequence %lld's run starts at position %d past its %zu "
                    "tokens",
                    static_cast<long long>(r.seq), r.first_position, history.size()));
    }
    const size_t end = static_cast<size_t>(r.first_position) + r.n_tokens;
    // A run that samples ends at the sequence's last token: whatever lay past it (drafts a
    // verification rejected) is gone. A prefill chunk leaves the rest of the prompt.
    if (r.n_logits > 0 || history.size() < end) history.resize(end);
    std::copy_n(step.tokens.begin() + r.first_token, r.n_tokens,
                history.begin() + r.first_position);
  }
  return Status::Ok();
}

void StepSampler::Logprobs(const float* row, int32_t token, int32_t k, SampledLogprobs* out) const {
  // log softmax of the raw logits at token, and the k most likely tokens.
  float max = row[0];
  for (int32_t v = 1; v < n_vocab_; ++v) max = std::max(max, row[v]);
  double sum = 0;
  for (int32_t v = 0; v < n_vocab_; ++v) sum += std::exp(static_cast<double>(row[v] - max));
  const float lse = max + static_cast<float>(std::log(sum));
  out->logprob = row[token] - lse;
  out->top.clear();
  k = std::min(k, n_vocab_);
  if (k <= 0) return;
  std::vector<TokenLogit> best;
  TopKInIdOrder(
      static_cast<size_t>(k),
      [&](auto visit) {
        for (int32_t v = 0; v < n_vocab_; ++v) visit(v, row[v]);
      },
      &best);
  for (const TokenLogit& t : best) out->top.push_back({t.id, t.logit - lse});
}

Status StepSampler::SampleRun(const StepRun& r, const float* rows,
                              std::vector<SampledTokens>* out) {
  if (r.n_logits != r.n_drafts + 1 || r.n_drafts >= r.n_tokens || r.n_drafts < 0 ||
      (!r.draft_probs.empty() && std::ssize(r.draft_probs) != r.n_drafts)) {
    return Status::Error(StrFormat("step: sequence %lld samples %d rows for %d drafts of %d tokens",
                                   static_cast<long long>(r.seq), r.n_logits, r.n_drafts,
                                   r.n_tokens));
  }
  State& st = states_.at(r.seq);
  const std::span<const int32_t> history(st.history);
  const size_t base = history.size() - static_cast<size_t>(r.n_drafts);
  out->assign(1 + r.forks.size(), {});
  SampledTokens& own = (*out)[0];
  if (r.n_drafts > 0) {
    const std::span<const int32_t> drafts = history.subspan(base);
    const VerifyResult v =
        VerifyDrafts(*st.sampler, rows, n_vocab_, history.first(base), drafts, r.draft_probs);
    own.tokens.assign(drafts.begin(), drafts.begin() + v.n_accepted);
    own.tokens.push_back(v.next_token);
    own.n_accepted = v.n_accepted;
  } else {
    own.tokens.push_back(st.sampler->Sample(rows, history));
  }
  if (st.logprobs >= 0) {
    own.logprobs.resize(own.tokens.size());
    for (size_t i = 0; i < own.tokens.size(); ++i) {
      Logprobs(rows + i * static_cast<size_t>(n_vocab_), own.tokens[i], st.logprobs,
               &own.logprobs[i]);
    }
  }
  for (size_t f = 0; f < r.forks.size(); ++f) {
    // (References into an unordered_map survive its rehashing: st stays valid.)
    State& child = Add(r.forks[f].seq, r.forks[f].sampling);
    child.history = st.history;
    SampledTokens& drew = (*out)[1 + f];
    drew.tokens.push_back(child.sampler->Sample(rows, child.history));
    if (child.logprobs >= 0) {
      drew.logprobs.resize(1);
      Logprobs(rows, drew.tokens[0], child.logprobs, &drew.logprobs[0]);
    }
  }
  return Status::Ok();
}

Status StepSampler::Sample(const StepBatch& step, const float* logits, StepOutput* out) {
  out->sampled.resize(step.runs.size());
  size_t row = 0;
  for (size_t i = 0; i < step.runs.size(); ++i) {
    const StepRun& r = step.runs[i];
    out->sampled[i].clear();
    if (r.n_logits == 0) continue;
    KVS_RETURN_IF_ERROR(SampleRun(r, logits + row * n_vocab_, &out->sampled[i]));
    row += static_cast<size_t>(r.n_logits);
  }
  return Status::Ok();
}

}  // namespace kvs
