#include "kernels/kv_layer.h"

#include <cstring>

namespace kvs {

void WriteKv(const KvLayerView& layer, int64_t slot, const float* k, const float* v) {
  const int64_t block = slot / kKvBlockTokens;
  const int32_t pos = static_cast<int32_t>(slot % kKvBlockTokens);
  float* kb = layer.k + static_cast<size_t>(block) * layer.k_block_stride();
  float* vb = layer.v + static_cast<size_t>(block) * layer.v_block_stride();
  for (int32_t h = 0; h < layer.n_head_kv; ++h) {
    float* kh = kb + static_cast<size_t>(h) * layer.head_dim_k * kKvBlockTokens;
    const float* ks = k + static_cast<size_t>(h) * layer.head_dim_k;
    for (int32_t d = 0; d < layer.head_dim_k; ++d) kh[d * kKvBlockTokens + pos] = ks[d];
    std::memcpy(vb + (static_cast<size_t>(h) * kKvBlockTokens + pos) * layer.head_dim_v,
                v + static_cast<size_t>(h) * layer.head_dim_v, layer.head_dim_v * sizeof(float));
  }
}

void CopyKvBlocks(const KvLayerView& layer, int64_t src, int64_t dst, int32_t n) {
  const size_t ks = layer.k_block_stride(), vs = layer.v_block_stride();
  std::memcpy(layer.k + static_cast<size_t>(dst) * ks, layer.k + static_cast<size_t>(src) * ks,
              n * ks * sizeof(float));
  std::memcpy(layer.v + static_cast<size_t>(dst) * vs, layer.v + static_cast<size_t>(src) * vs,
              n * vs * sizeof(float));
}

}  // namespace kvs
