// Prompt lookup (vLLM's "ngram", llama.cpp's "ngram-simple"): the last n tokens of a sequence
// (prompt and output) are searched for earlier in it, and what followed their latest earlier
// occurrence is proposed. No model and no memory beyond the tokens; pays off where the output
// repeats its input (code edits, quoting, summaries of a passage). Drafts are point masses.
#pragma once

#include "engine/spec/drafter.h"

namespace kvs {

struct NgramOptions {
  int32_t n_max = 4;  // longest suffix tried first (--spec-ngram-max)
  int32_t n_min = 2;  // shortest suffix accepted (1 matches too eagerly on prose)
};

class NgramDrafter final : public Drafter {
 public:
  explicit NgramDrafter(NgramOptions options = {}) : options_(options) {}
  std::string_view name() const override { return "ngram"; }
  double relative_cost() const override { return 0.0; }
  Status Propose(std::span<const DraftRequest> requests, const KvCacheManager& kv,
                 std::span<Draft> drafts) override;

 private:
  NgramOptions options_;
};

// The proposal for tokens[0, n): up to k tokens following the latest earlier occurrence of the
// longest suffix of length n_max..n_min that occurs earlier. Exposed for tests.
std::vector<int32_t> LookupNgram(std::span<const int32_t> tokens, int32_t k, int32_t n_min,
                                 int32_t n_max);

}  // namespace kvs
