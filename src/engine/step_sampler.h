// Sampling as a runner does it, from the step's plain data alone: each sequence's Sampler and
// token history (for the penalties), kept as the batches say, and every sampling run's draw
// from its logits rows: one token, or a verification of its drafts (spec/rejection_sampler.h),
// with logprobs where asked. ModelRunner uses it after its forward pass; a device runner would
// do the same on the device. The Sampler of a sequence is created when the runner first hears
// of it and lives until it is released, so its RNG stream is the sequence's, whatever the
// batching.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "engine/sampler.h"
#include "engine/step_batch.h"

namespace kvs {

class StepSampler {
 public:
  explicit StepSampler(int32_t n_vocab) : n_vocab_(n_vocab) {}

  // Before the pass: forgets released sequences, adds new ones, writes the runs' tokens into
  // the histories. Errors: a run of a sequence never sent, or whose tokens leave a gap.
  Status Apply(const StepBatch& step);
  // After the pass: draws every sampling run's tokens (and its forks') from
  // logits[step.n_logit_rows][n_vocab] into out->sampled.
  Status Sample(const StepBatch& step, const float* logits, StepOutput* out);

  size_t num_sequences() const { return states_.size(); }

 private:
  struct State {
    std::unique_ptr<Sampler> sampler;
    std::vector<int32_t> history;  // the sequence's tokens, drafts of the current run included
    int32_t logprobs = -1;
  };
  State& Add(int64_t seq, const StepSampling& sampling);
  Status SampleRun(const StepRun& run, const float* rows, std::vector<SampledTokens>* out);
  void Logprobs(const float* row, int32_t token, int32_t k, SampledLogprobs* out) const;

  int32_t n_vocab_;
  std::unordered_map<int64_t, State> states_;
};

}  // namespace kvs
