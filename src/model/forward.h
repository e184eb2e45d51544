// One forward pass over a run of tokens of one sequence (llama, qwen2, qwen3).
#pragma once

#include <cstdint>
#include <vector>

#include "core/aligned.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "model/kv_cache_simple.h"
#include "model/weights.h"

namespace kvs {

class ForwardPass {
 public:
  // Longest run of tokens processed at once; longer inputs are split (bounds scratch memory).
  static constexpr int32_t kMaxUbatch = 512;
  // Attention queries per pool job (a multiple of the kernel's tile of four).
  static constexpr int32_t kQueriesPerJob = 16;

  ForwardPass(const Model& model, ThreadPool& pool);

  // Runs tokens[0..n) at positions pos0..pos0+n-1, storing their K/V in `cache`, and writes
  // logits for the last n_out tokens into logits[n_out][n_vocab].
  Status Run(const int32_t* tokens, int32_t n, int32_t pos0, SimpleKvCache& cache, int32_t n_out,
             float* logits);

 private:
  void RunUbatch(const int32_t* tokens, int32_t n, int32_t pos0, SimpleKvCache& cache);
  void Attention(int32_t layer, int32_t n, int32_t pos0, const SimpleKvCache& cache);
  void Reserve(int32_t n, int32_t n_ctx);
  // Runs fn(i) for every token of the ubatch, split over the pool when there are several.
  template <typename Fn>
  void ForEachToken(int32_t n, const Fn& fn);

  const Model& model_;
  const ModelConfig& c_;
  ThreadPool& pool_;
  int32_t reserved_tokens_ = 0;
  int32_t reserved_ctx_ = 0;
  AlignedBuffer x_;     // [n][n_embd] residual stream
  AlignedBuffer xn_;    // [n][n_embd] normalized input of a sublayer
  AlignedBuffer q_;     // [n][n_head * head_dim_k]
  AlignedBuffer k_;     // [n][n_head_kv * head_dim_k]
  AlignedBuffer v_;     // [n][n_head_kv * head_dim_v]
  AlignedBuffer att_;   // [n][n_head * head_dim_v]
  AlignedBuffer gate_;  // [n][n_ff]
  AlignedBuffer up_;    // [n][n_ff]
  AlignedBuffer proj_;  // [n][max(n_embd, ...)] output of wo / w_down
  AlignedBuffer rope_;  // [n][n_rot] cos/sin per token
};

}  // namespace kvs
