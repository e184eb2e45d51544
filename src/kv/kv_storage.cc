#include "kv/kv_storage.h"

#include <utility>

#include "core/check.h"

namespace kvs {

size_t KvGeometry::BytesPerBlock() const {
  const size_t head_blocks =
      KvHeadBlockBytes(k_type, head_dim_k) + KvHeadBlockBytes(v_type, head_dim_v);
  return static_cast<size_t>(n_layer) * n_head_kv * head_blocks * (block_size / kKvBlockTokens);
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
  KVS_RETURN_IF_ERROR(ValidateKvType(k_type, head_dim_k));
  return ValidateKvType(v_type, head_dim_v);
}

KvStorage::KvStorage(const KvGeometry& geometry, int32_t n_blocks)
    : geometry_(geometry), n_blocks_(n_blocks) {
  KVS_CHECK(geometry.Validate().ok() && n_blocks >= 1);
  const size_t kernel_blocks =
      static_cast<size_t>(n_blocks) * (geometry.block_size / kKvBlockTokens);
  KvLayerView layer;
  layer.n_head_kv = geometry.n_head_kv;
  layer.head_dim_k = geometry.head_dim_k;
  layer.head_dim_v = geometry.head_dim_v;
  layer.k_type = geometry.k_type;
  layer.v_type = geometry.v_type;
  const size_t k_bytes = kernel_blocks * layer.k_block_stride();
  const size_t v_bytes = kernel_blocks * layer.v_block_stride();
  memory_ = AllocateAligned<uint8_t>((k_bytes + v_bytes) * geometry.n_layer);
  uint8_t* p = memory_.get();
  for (int32_t l = 0; l < geometry.n_layer; ++l) {
    layer.k = p;
    layer.v = p + k_bytes;
    layers_.push_back(layer);
    p += k_bytes + v_bytes;
  }
}

void KvStorage::SetKeyCoding(KeyCoding coding) {
  const size_t per_layer = static_cast<size_t>(geometry_.n_head_kv) * geometry_.head_dim_k;
  const size_t heads = static_cast<size_t>(geometry_.n_layer) * geometry_.n_head_kv;
  KVS_CHECK(coding.offsets.empty() || coding.offsets.size() == per_layer * geometry_.n_layer);
  KVS_CHECK(coding.whitening.empty() || coding.whitening.size() == heads);
  KVS_CHECK(coding.whitening.empty() == !KvKeysWhitened(geometry_.k_type, geometry_.head_dim_k));
  key_coding_ = std::move(coding);
  for (int32_t l = 0; l < geometry_.n_layer; ++l) {
    KvLayerView& layer = layers_[l];
    if (!key_coding_.offsets.empty()) {
      layer.k_offset = key_coding_.offsets.data() + l * per_layer;
      layer.k_offset_follows_rope = KvKeyOffsetFollowsRope(geometry_.k_type);
    }
    if (!key_coding_.whitening.empty()) {
      layer.k_whitening =
          key_coding_.whitening.data() + static_cast<size_t>(l) * geometry_.n_head_kv;
    }
  }
}

}  // namespace kvs
