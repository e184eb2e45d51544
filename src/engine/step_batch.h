// One step as plain data: what a runner (this CPU's ModelRunner, or a device backend) needs to
// compute a step, and what it gives back. Nothing in it points into the engine: a runner keeps
// its own copy of each sequence's block table and tokens, and each step brings what changed
// since the last (vLLM v1's SchedulerOutput has the same shape: new requests whole, then
// per-step deltas). StepBatchBuilder (step_batch_builder.h) makes these from the scheduler's plan.
#pragma once

#include <cstdint>
#include <vector>

#include "core/ids.h"
#include "engine/sampler.h"
#include "kv/compaction.h"
#include "kv/kv_cache_manager.h"

namespace kvs {

// How a sequence samples: the runner keeps a Sampler of these parameters per sequence (its RNG
// stream lives as long as the sequence, preemptions included).
struct StepSampling {
  SamplingParams params;  // the seed already the choice's (a request's seed + choice)
  int32_t logprobs = -1;  // >= 0: the sampled token's log-probability and this many top ones
};

// A sequence the runner has not seen (or was told to forget): its tokens so far, whole, so that a
// runner holding per-sequence state (token history for penalties, a device-side token buffer)
// has the tokens a prefix-cache hit spares it from computing.
struct StepNewSequence {
  int64_t seq = 0;              // SeqId value: the runner's key for everything of this sequence
  std::vector<int32_t> tokens;  // [prompt + output so far]; a run's tokens overwrite from its
                                // first position on (drafts, a recompute after preemption)
  StepSampling sampling;
};

// A choice of an n > 1 request, forked from its first sequence when that one's prompt ends: it
// draws its first token from the same logits row, with its own sampler, and has the parent's
// tokens so far.
struct StepFork {
  int64_t seq = 0;
  StepSampling sampling;
};

// The change of one block table since the runner last saw it: keep the first `keep` blocks of
// the runner's copy, drop the rest, then append `append`.
struct TableDelta {
  int32_t keep = 0;
  std::vector<BlockId> append;
};

// One sequence's run in the step.
struct StepRun {
  int64_t seq = 0;
  int32_t first_token = 0;  // index of its first token in StepBatch::tokens
  int32_t n_tokens = 0;     // tokens [first_token, first_token + n_tokens)
  int32_t n_cached = 0;     // slots holding K/V before the step: token i writes slot n_cached + i
  int32_t first_position = 0;  // the RoPE position of its first token
  int32_t n_logits = 0;        // logit rows wanted, for its last n_logits tokens
  // Of its tokens, the last n_drafts are drafts to verify (n_logits is then n_drafts + 1), with
  // the distribution each was drawn from (empty: point masses, as an n-gram drafter's).
  int32_t n_drafts = 0;
  std::vector<std::vector<TokenProb>> draft_probs;
  std::vector<StepFork> forks;  // choices that start here (see StepFork)
  // [n_groups] its block table in each KV group (kv/kv_group.h; pool block ids), as a change
  // to the runner's copy. Each table covers every slot the run writes.
  std::vector<TableDelta> tables;
  // The RoPE position of the key in each slot [n_cached + n_tokens], or empty when slot i holds
  // position i (token eviction moves keys to other slots; their positions stay).
  std::vector<int32_t> key_positions;
  // Token eviction's attention mass (kv/eviction_policy.h): when mass_first_token >= 0, the
  // queries of tokens [mass_first_token, n_tokens) add the attention they give each slot, summed
  // over heads and layers, to attention_mass (what was observed so far, one entry per slot; it
  // grows to n_cached + n_tokens with zeros) and StepOutput returns the sums.
  int32_t mass_first_token = -1;
  std::vector<float> attention_mass;
};

struct StepBatch {
  std::vector<int32_t> tokens;     // [n_tokens] every run's tokens, run after run
  std::vector<int32_t> positions;  // [n_tokens] their RoPE positions
  // [n_groups][n_tokens] the pool slot each writes in each KV group's blocks: block id *
  // block_size + offset in the block
  std::vector<std::vector<int64_t>> slots;
  std::vector<StepRun> runs;
  std::vector<StepNewSequence> new_sequences;  // before the runs that name them
  std::vector<int64_t> released;               // sequences to forget (finished), before all else
  std::vector<BlockCopy> copies;               // block copies to do before anything is computed
  int32_t n_logit_rows = 0;                    // the sum of the runs' n_logits
  int32_t block_size = 0;                      // positions per pool block (the runner's format's)
  // Perplexity's scoring wants the logits themselves and draws nothing.
  bool return_logits = false;

  int32_t n_tokens() const { return static_cast<int32_t>(tokens.size()); }
  void Clear() {
    tokens.clear();
    positions.clear();
    for (auto& g : slots) g.clear();
    runs.clear();
    new_sequences.clear();
    released.clear();
    copies.clear();
    n_logit_rows = 0;
    return_logits = false;
  }
};

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;
};

// A sampled token's log-probability under the model's distribution (the raw logits' log
// softmax, before penalties and temperature) and the most likely tokens', best first.
struct SampledLogprobs {
  float logprob = 0;
  std::vector<TokenLogprob> top;
};

// What one choice of a run drew: one token, or after a verification the accepted drafts and the
// token after them. logprobs: one per token, when the sequence asked for them.
struct SampledTokens {
  std::vector<int32_t> tokens;
  int32_t n_accepted = 0;  // drafts kept (a verification)
  std::vector<SampledLogprobs> logprobs;
};

struct StepOutput {
  // Per run that samples (n_logits > 0): the run's sequence's draw, then each fork's; empty
  // for the others.
  std::vector<std::vector<SampledTokens>> sampled;
  // [n_logit_rows][n_vocab], only when the batch asks for them (return_logits: perplexity).
  std::vector<float> logits;
  // Per run: the observed attention mass (StepRun::attention_mass plus this step's), empty for
  // runs that observe none.
  std::vector<std::vector<float>> attention_mass;
};

// A runner's copy of one sequence's block table, kept as the step deltas say.
inline void ApplyTableDelta(const TableDelta& delta, std::vector<BlockId>* table) {
  table->resize(static_cast<size_t>(delta.keep));
  table->insert(table->end(), delta.append.begin(), delta.append.end());
}

}  // namespace kvs
