// One sequence over a private paged KV cache, without a scheduler: the plain way to run the
// model over one stream of tokens (perplexity, tests, the speed benchmark). Its block table
// runs backwards through its pool (block n, n-1, ... 1), so this path exercises the paging too.
#pragma once

#include <cstdint>
#include <vector>

#include "core/thread_pool.h"
#include "kv/kv_storage.h"
#include "model/forward.h"

namespace kvs {

class SingleSequence {
 public:
  // Built by EngineBuilder::Single (engine_builder.h), which makes the format; a plain f32
  // format where none is given (tests).
  SingleSequence(const Model& model, ThreadPool& pool, int32_t n_ctx, KvFormatPtr format = nullptr);
  const KvStorage& storage() const { return storage_; }
  // For tools that rewrite stored blocks between runs (the KV codec bench's round trips).
  KvStorage& mutable_storage() { return storage_; }
  // The pool block holding positions [i * block_size, (i + 1) * block_size).
  int32_t pool_block(int32_t i) const { return storage_.num_blocks() - 1 - i; }

  int32_t n_ctx() const { return n_ctx_; }
  // Computes tokens[0..n) at positions pos0.. (positions >= pos0 written before are replaced)
  // and writes logits of the last n_out into logits[n_out][n_vocab].
  Status Run(const int32_t* tokens, int32_t n, int32_t pos0, int32_t n_out, float* logits);

 private:
  int32_t n_ctx_;
  KvStorage storage_;
  std::vector<int32_t> blocks_;
  ForwardPass forward_;
  RaggedBatch batch_;
};

}  // namespace kvs
