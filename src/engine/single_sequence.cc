#include "engine/single_sequence.h"

#include <utility>

#include "engine/kv_format_factory.h"

namespace kvs {

namespace {
// A cache of n_ctx positions in the format (a plain f32 one where none is given).
KvStorage SequenceStorage(const Model& model, KvFormatPtr format, int32_t n_ctx) {
  if (format == nullptr) {
    format = PlainKvFormat(ModelKvGeometry(model.config(), kKvBlockTokens), ModelKvRope(model));
  }
  const int32_t block_size = format->block_size();
  return KvStorage(std::move(format), (n_ctx + block_size - 1) / block_size + 1);
}
}  // namespace

SingleSequence::SingleSequence(const Model& model, ThreadPool& pool, int32_t n_ctx,
                               KvFormatPtr format)
    : n_ctx_(n_ctx),
      storage_(SequenceStorage(model, std::move(format), n_ctx)),
      forward_(model, pool) {
  const int32_t m = storage_.kernel_blocks_per_block();
  for (int32_t b = storage_.num_blocks() - 1; b >= 1; --b) {
    for (int32_t j = 0; j < m; ++j) blocks_.push_back(b * m + j);
  }
  storage_.ReservePositions(n_ctx);
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
