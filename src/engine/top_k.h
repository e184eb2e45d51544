// The k most likely tokens of a logits row, in one pass: what top-k sampling keeps and what
// top logprobs report. Shared so that both rank ties the same way (by id).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvs {

struct TokenLogit {
  int32_t id;
  float logit;
};

// Most likely first, ties by id: a strict total order (NaN logits aside).
inline bool MoreLikely(const TokenLogit& a, const TokenLogit& b) {
  return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
}

// Leaves in *out the k most likely of the (id, logit) pairs for_each(visit) visits in id order,
// most likely first. A heap whose front is the worst of the best k so far: ids come in order, so
// one whose logit equals the front's loses the tie and only a larger logit gets in. The kept set
// is a partial sort's, found without copying or ordering the rest.
template <typename ForEach>
void TopKInIdOrder(size_t k, ForEach&& for_each, std::vector<TokenLogit>* out) {
  out->clear();
  if (k == 0) return;
  float worst = 0;
  for_each([&](int32_t id, float logit) {
    if (out->size() < k) {
      out->push_back({id, logit});
      std::push_heap(out->begin(), out->end(), MoreLikely);
      worst = out->front().logit;
    } else if (logit > worst) {
      std::pop_heap(out->begin(), out->end(), MoreLikely);
      out->back() = {id, logit};
      std::push_heap(out->begin(), out->end(), MoreLikely);
      worst = out->front().logit;
    }
  });
  std::sort(out->begin(), out->end(), MoreLikely);
}

}  // namespace kvs
