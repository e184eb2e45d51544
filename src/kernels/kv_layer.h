// One layer of the paged KV cache as the kernels see it: keys and values of the layer's types in
// blocks of kKvBlockTokens positions (the attention kernel's block), each block one head block
// (kv_types.h) per KV head:
//   keys   [kernel_block][n_head_kv][head block of k_type]
//   values [kernel_block][n_head_kv][head block of v_type]
// A pool block of block_size = m * 16 positions is m consecutive kernel blocks, so a slot s (pool
// block * block_size + offset) is kernel block s / 16, position s % 16, whatever the block size.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/attention.h"
#include "kernels/kv_types.h"

namespace kvs {

struct KvLayerView {
  uint8_t* k = nullptr;
  uint8_t* v = nullptr;
  int32_t n_head_kv = 0;
  int32_t head_dim_k = 0;
  int32_t head_dim_v = 0;
  KvType k_type = KvType::kF32;
  KvType v_type = KvType::kF32;
  // [n_head_kv][head_dim_k] subtracted from every key before it is stored, or nullptr. Any
  // vector that is the same for all positions of a head leaves attention exactly as it was
  // (softmax ignores the constant q . offset a query adds to all its scores), so taking the
  // keys' common mean out lets a quantized type spend its codes on what differs between keys.
  const float* k_offset = nullptr;

  size_t k_head_bytes() const { return KvHeadBlockBytes(k_type, head_dim_k); }
  size_t v_head_bytes() const { return KvHeadBlockBytes(v_type, head_dim_v); }
  size_t k_block_stride() const { return static_cast<size_t>(n_head_kv) * k_head_bytes(); }
  size_t v_block_stride() const { return static_cast<size_t>(n_head_kv) * v_head_bytes(); }
  // KV head g over the kernel blocks listed in kernel_block_ids.
  KvHeadView Head(int32_t g, const int32_t* kernel_block_ids) const {
    KvHeadView view;
    view.k_base = k + static_cast<size_t>(g) * k_head_bytes();
    view.v_base = v + static_cast<size_t>(g) * v_head_bytes();
    view.k_block_stride = k_block_stride();
    view.v_block_stride = v_block_stride();
    view.block_ids = kernel_block_ids;
    view.k_type = k_type;
    view.v_type = v_type;
    return view;
  }
};

// Stores (quantizes) one position's keys [n_head_kv][head_dim_k] and values
// [n_head_kv][head_dim_v] in slot. Positions that share a kernel block must be written by one
// thread: sub-byte codes of neighbouring positions share bytes.
void WriteKv(const KvLayerView& layer, int64_t slot, const float* k, const float* v);

// Copies n kernel blocks starting at src to the n starting at dst (one layer).
void CopyKvBlocks(const KvLayerView& layer, int64_t src, int64_t dst, int32_t n);

}  // namespace kvs
