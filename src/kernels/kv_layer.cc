#include "kernels/kv_layer.h"

#include <cstring>
#include <vector>

#include "kernels/kv_quant.h"

namespace kvs {

void WriteKv(const KvLayerView& layer, int64_t slot, const float* k, const float* v) {
  const int64_t block = slot / kKvBlockTokens;
  const int32_t pos = static_cast<int32_t>(slot % kKvBlockTokens);
  uint8_t* kb = layer.k + static_cast<size_t>(block) * layer.k_block_stride();
  uint8_t* vb = layer.v + static_cast<size_t>(block) * layer.v_block_stride();
  const size_t kh = layer.k_head_bytes(), vh = layer.v_head_bytes();
  thread_local std::vector<float> shifted;
  if (layer.k_offset != nullptr) {
    const size_t n = static_cast<size_t>(layer.n_head_kv) * layer.head_dim_k;
    shifted.resize(n);
    for (size_t i = 0; i < n; ++i) shifted[i] = k[i] - layer.k_offset[i];
    k = shifted.data();
  }
  for (int32_t h = 0; h < layer.n_head_kv; ++h) {
    StoreKey(layer.k_type, kb + h * kh, layer.head_dim_k, pos,
             k + static_cast<size_t>(h) * layer.head_dim_k);
    StoreValue(layer.v_type, vb + h * vh, layer.head_dim_v, pos,
               v + static_cast<size_t>(h) * layer.head_dim_v);
  }
}

void CopyKvBlocks(const KvLayerView& layer, int64_t src, int64_t dst, int32_t n) {
  const size_t ks = layer.k_block_stride(), vs = layer.v_block_stride();
  std::memcpy(layer.k + static_cast<size_t>(dst) * ks, layer.k + static_cast<size_t>(src) * ks,
              n * ks);
  std::memcpy(layer.v + static_cast<size_t>(dst) * vs, layer.v + static_cast<size_t>(src) * vs,
              n * vs);
}

}  // namespace kvs
