#include "engine/spec/ngram_drafter.h"

#include <algorithm>

namespace kvs {

std::vector<int32_t> LookupNgram(std::span<const int32_t> tokens, int32_t k, int32_t n_min,
                                 int32_t n_max) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  for (int32_t len = std::min<int64_t>(n_max, n - 1); len >= std::max(1, n_min); --len) {
    const int32_t* suffix = tokens.data() + n - len;
    // The latest earlier occurrence: its end is before the suffix's end, so a token follows it.
    for (int64_t start = n - len - 1; start >= 0; --start) {
      if (!std::equal(suffix, suffix + len, tokens.data() + start)) continue;
      const int64_t from = start + len;
      const int64_t count = std::min<int64_t>(k, n - from);
      return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + from + count);
    }
  }
  return {};
}

Status NgramDrafter::Propose(std::span<const DraftRequest> requests, const KvCacheManager&,
                             std::span<Draft> drafts) {
  for (size_t i = 0; i < requests.size(); ++i) {
    const Sequence& seq = *requests[i].seq;
    drafts[i].tokens = LookupNgram(std::span(seq.tokens.data(), seq.n_committed()),
                                   requests[i].max_drafts, options_.n_min, options_.n_max);
    drafts[i].probs.clear();
  }
  return Status::Ok();
}

}  // namespace kvs
