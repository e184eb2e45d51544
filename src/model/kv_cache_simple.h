// A contiguous per-sequence KV cache in f32: the stand-in until the paged cache (kv/)
// replaces it. It already stores K and V in the 16-position block layout of kernels/attention.h,
// its blocks simply in order:
//   K [n_layer][block][n_head_kv][head_dim_k][16]
//   V [n_layer][block][n_head_kv][16][head_dim_v]
#pragma once

#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "kernels/attention.h"
#include "model/config.h"

namespace kvs {

class SimpleKvCache {
 public:
  SimpleKvCache(const ModelConfig& config, int32_t n_ctx)
      : n_ctx_(n_ctx),
        n_blocks_((n_ctx + kKvBlockTokens - 1) / kKvBlockTokens),
        n_head_kv_(config.n_head_kv),
        head_dim_k_(config.head_dim_k),
        head_dim_v_(config.head_dim_v),
        k_block_stride_(static_cast<size_t>(n_head_kv_) * head_dim_k_ * kKvBlockTokens),
        v_block_stride_(static_cast<size_t>(n_head_kv_) * head_dim_v_ * kKvBlockTokens),
        k_(static_cast<size_t>(config.n_layer) * n_blocks_ * k_block_stride_),
        v_(static_cast<size_t>(config.n_layer) * n_blocks_ * v_block_stride_),
        block_ids_(static_cast<size_t>(n_blocks_)) {
    std::iota(block_ids_.begin(), block_ids_.end(), 0);
  }

  int32_t n_ctx() const { return n_ctx_; }
  size_t bytes() const { return (k_.size() + v_.size()) * sizeof(float); }

  // Stores position pos's keys [n_head_kv][head_dim_k] and values [n_head_kv][head_dim_v].
  void Write(int32_t layer, int32_t pos, const float* k, const float* v) {
    const size_t block = static_cast<size_t>(layer) * n_blocks_ + pos / kKvBlockTokens;
    const int32_t slot = pos % kKvBlockTokens;
    float* kb = k_.data() + block * k_block_stride_;
    float* vb = v_.data() + block * v_block_stride_;
    for (int32_t h = 0; h < n_head_kv_; ++h) {
      float* kh = kb + static_cast<size_t>(h) * head_dim_k_ * kKvBlockTokens;
      for (int32_t d = 0; d < head_dim_k_; ++d) {
        kh[d * kKvBlockTokens + slot] = k[h * head_dim_k_ + d];
      }
      std::memcpy(vb + (static_cast<size_t>(h) * kKvBlockTokens + slot) * head_dim_v_,
                  v + h * head_dim_v_, head_dim_v_ * sizeof(float));
    }
  }

  KvHeadView Head(int32_t layer, int32_t kv_head) const {
    const size_t layer_block = static_cast<size_t>(layer) * n_blocks_;
    KvHeadView view;
    view.k_base = k_.data() + layer_block * k_block_stride_ +
                  static_cast<size_t>(kv_head) * head_dim_k_ * kKvBlockTokens;
    view.v_base = v_.data() + layer_block * v_block_stride_ +
                  static_cast<size_t>(kv_head) * kKvBlockTokens * head_dim_v_;
    view.k_block_stride = k_block_stride_;
    view.v_block_stride = v_block_stride_;
    view.block_ids = block_ids_.data();
    return view;
  }

 private:
  int32_t n_ctx_, n_blocks_, n_head_kv_, head_dim_k_, head_dim_v_;
  size_t k_block_stride_, v_block_stride_;
  std::vector<float> k_, v_;
  std::vector<int32_t> block_ids_;  // identity: logical block i is block i
};

}  // namespace kvs
