// Verification of drafted tokens against the target's logits, keeping the output distribution
// exactly the target's (Leviathan et al. 2023, Chen et al. 2023):
//   greedy (temperature 0): accept draft i while it is the target's argmax; the first mismatch
//     is replaced by the argmax, and after k accepted drafts the argmax of row k is the bonus.
//   sampled: accept draft d with probability min(1, p(d) / q(d)); on the first rejection draw
//     from normalize(max(0, p - q)) and stop; after k accepted drafts draw a bonus from row k.
// p and q are *processed* distributions: the target's from the sequence's own Sampler (penalties,
// top-k, top-p, min-p, temperature, with the drafts before position i counted as in flight),
// the draft's from the drafter, which draws with the same sampling parameters. A drafter without
// probabilities (n-gram) is a point mass q(d) = 1.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/sampler.h"

namespace kvs {

struct VerifyResult {
  int32_t n_accepted = 0;   // drafts kept, a prefix of them
  int32_t next_token = -1;  // the token after them: a correction, or the bonus when all passed
};

// logits: [drafts.size() + 1][n_vocab], row i the target's logits at the position of draft i
// (row 0 at the last committed token). history: the committed tokens. q: per draft, the draft's
// distribution, or empty for point masses. Uses sampler's RNG (nothing at temperature 0).
VerifyResult VerifyDrafts(Sampler& sampler, const float* logits, int32_t n_vocab,
                          std::span<const int32_t> history, std::span<const int32_t> drafts,
                          std::span<const std::vector<TokenProb>> q);

}  // namespace kvs
