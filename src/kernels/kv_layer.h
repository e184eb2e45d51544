// One layer of the paged KV cache as the kernels see it: f32 keys and values in blocks of
// kKvBlockTokens positions (the attention kernel's block). A pool block of block_size = m * 16
// positions is m consecutive kernel blocks, so a slot s (pool block * block_size + offset) is
// kernel block s / 16, position s % 16, whatever the pool's block size.
//   keys   [kernel_block][n_head_kv][head_dim_k][16]
//   values [kernel_block][n_head_kv][16][head_dim_v]
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/attention.h"

namespace kvs {

struct KvLayerView {
  float* k = nullptr;
  float* v = nullptr;
  int32_t n_head_kv = 0;
  int32_t head_dim_k = 0;
  int32_t head_dim_v = 0;

  size_t k_block_stride() const {
    return static_cast<size_t>(n_head_kv) * head_dim_k * kKvBlockTokens;
  }
  size_t v_block_stride() const {
    return static_cast<size_t>(n_head_kv) * head_dim_v * kKvBlockTokens;
  }
  // KV head g over the kernel blocks listed in kernel_block_ids.
  KvHeadView Head(int32_t g, const int32_t* kernel_block_ids) const {
    KvHeadView view;
    view.k_base = k + static_cast<size_t>(g) * head_dim_k * kKvBlockTokens;
    view.v_base = v + static_cast<size_t>(g) * kKvBlockTokens * head_dim_v;
    view.k_block_stride = k_block_stride();
    view.v_block_stride = v_block_stride();
    view.block_ids = kernel_block_ids;
    return view;
  }
};

// Stores one position's keys [n_head_kv][head_dim_k] and values [n_head_kv][head_dim_v] in slot.
void WriteKv(const KvLayerView& layer, int64_t slot, const float* k, const float* v);

// Copies n kernel blocks starting at src to the n starting at dst (one layer).
void CopyKvBlocks(const KvLayerView& layer, int64_t src, int64_t dst, int32_t n);

}  // namespace kvs
