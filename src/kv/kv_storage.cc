#include "kv/kv_storage.h"

#include "core/check.h"

namespace kvs {

size_t KvGeometry::BytesPerToken() const {
  return static_cast<size_t>(n_layer) * n_head_kv * (head_dim_k + head_dim_v) * sizeof(float);
}

Status KvGeometry::Validate() const {
  if (n_layer <= 0 || n_head_kv <= 0 || head_dim_k <= 0 || head_dim_v <= 0) {
    return Status::Error("KV geometry: layers, heads and head sizes must be positive");
  }
  if (block_size <= 0 || block_size % kKvBlockTokens != 0 || block_size > 1024) {
    return Status::Error(StrFormat(
        "--block-size %d: must be a multiple of %d between %d and 1024 (the attention kernel "
        "reads %d positions at a time)",
        block_size, kKvBlockTokens, kKvBlockTokens, kKvBlockTokens));
  }
  return Status::Ok();
}

KvStorage::KvStorage(const KvGeometry& geometry, int32_t n_blocks)
    : geometry_(geometry), n_blocks_(n_blocks) {
  KVS_CHECK(geometry.Validate().ok() && n_blocks >= 1);
  const size_t positions = static_cast<size_t>(n_blocks) * geometry.block_size;
  const size_t k_floats = positions * geometry.n_head_kv * geometry.head_dim_k;
  const size_t v_floats = positions * geometry.n_head_kv * geometry.head_dim_v;
  memory_ = AllocateAligned<float>((k_floats + v_floats) * geometry.n_layer);
  float* p = memory_.get();
  for (int32_t l = 0; l < geometry.n_layer; ++l) {
    KvLayerView layer;
    layer.k = p;
    layer.v = p + k_floats;
    layer.n_head_kv = geometry.n_head_kv;
    layer.head_dim_k = geometry.head_dim_k;
    layer.head_dim_v = geometry.head_dim_v;
    layers_.push_back(layer);
    p += k_floats + v_floats;
  }
}

}  // namespace kvs
