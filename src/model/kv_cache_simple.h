// A contiguous per-sequence KV cache in f32: the stand-in until the paged cache (kv/)
// replaces it. Layout per layer: [pos][kv_head][head_dim] for K and V separately.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"

namespace kvs {

class SimpleKvCache {
 public:
  SimpleKvCache(const ModelConfig& config, int32_t n_ctx)
      : n_ctx_(n_ctx),
        k_stride_(config.k_dim()),
        v_stride_(config.v_dim()),
        k_(static_cast<size_t>(config.n_layer) * n_ctx * k_stride_),
        v_(static_cast<size_t>(config.n_layer) * n_ctx * v_stride_) {}

  int32_t n_ctx() const { return n_ctx_; }
  float* k(int32_t layer, int32_t pos) {
    return &k_[(static_cast<size_t>(layer) * n_ctx_ + pos) * k_stride_];
  }
  float* v(int32_t layer, int32_t pos) {
    return &v_[(static_cast<size_t>(layer) * n_ctx_ + pos) * v_stride_];
  }
  size_t bytes() const { return (k_.size() + v_.size()) * sizeof(float); }

 private:
  int32_t n_ctx_;
  int64_t k_stride_, v_stride_;
  std::vector<float> k_;  // [n_layer][n_ctx][n_head_kv * head_dim_k]
  std::vector<float> v_;  // [n_layer][n_ctx][n_head_kv * head_dim_v]
};

}  // namespace kvs
