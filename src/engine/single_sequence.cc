#include "engine/single_sequence.h"

#include <utility>

#include "engine/model_runner.h"

namespace kvs {

SingleSequence::SingleSequence(const Model& model, ThreadPool& pool, int32_t n_ctx, KvTypes types,
                               KeyCoding key_coding)
    : n_ctx_(n_ctx),
      storage_(ModelKvGeometry(model.config(), kKvBlockTokens, types),
               (n_ctx + kKvBlockTokens - 1) / kKvBlockTokens + 1),
      forward_(model, pool) {
  for (int32_t b = storage_.num_blocks() - 1; b >= 1; --b) blocks_.push_back(b);
  if (!key_coding.empty()) storage_.SetKeyCoding(std::move(key_coding));
}

Status SingleSequence::Run(const int32_t* tokens, int32_t n, int32_t pos0, int32_t n_out,
                           float* logits) {
  if (n <= 0) return Status::Error("forward pass needs at least one token");
  if (n_out < 0 || n_out > n) return Status::Error("n_out out of range");
  if (pos0 < 0 || static_cast<int64_t>(pos0) + n > n_ctx_) {
    return Status::Error(StrFormat("context full: positions %d..%d exceed the context size %d",
                                   pos0, pos0 + n - 1, n_ctx_));
  }
  batch_.Clear();
  batch_.AddSequence(tokens, n, pos0, blocks_, n_out);
  return forward_.Run(batch_, storage_.layers(), logits);
}

}  // namespace kvs
