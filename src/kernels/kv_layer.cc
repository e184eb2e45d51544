#include "kernels/kv_layer.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "kernels/attention.h"
#include "kernels/kv_quant.h"
#include "kernels/ops.h"

namespace kvs {

const char* KeyCodingKindName(KeyCodingKind kind) {
  switch (kind) {
    case KeyCodingKind::kPlain:
      return "plain";
    case KeyCodingKind::kConstantOffset:
      return "constant-offset";
    case KeyCodingKind::kRopeOffset:
      return "rope-offset";
    case KeyCodingKind::kWhitened:
      return "whitened";
  }
  return "unknown";
}

KeyCodingKind KeyCodingKindFor(KvType k_type, int32_t head_dim_k) {
  if (!KvTypeIsQuantized(k_type)) return KeyCodingKind::kPlain;
  if (KvKeysWhitened(k_type, head_dim_k)) return KeyCodingKind::kWhitened;
  return KvKeyOffsetFollowsRope(k_type) ? KeyCodingKind::kRopeOffset
                                        : KeyCodingKind::kConstantOffset;
}

void WriteKv(const KvLayerView& layer, int64_t slot, int32_t position, const float* k,
             const float* v) {
  const int64_t block = slot / kKvBlockTokens;
  const int32_t pos = static_cast<int32_t>(slot % kKvBlockTokens);
  uint8_t* kb = layer.k + static_cast<size_t>(block) * layer.k_block_stride();
  uint8_t* vb = layer.v + static_cast<size_t>(block) * layer.v_block_stride();
  const size_t kh = layer.k_head_bytes(), vh = layer.v_head_bytes();
  thread_local std::vector<float> shifted, offset, cos_sin;
  if (layer.NeedsRopeTable()) {
    KVS_CHECK(layer.rope_table != nullptr && position < layer.rope_positions && layer.n_rot > 0 &&
              layer.n_rot <= layer.head_dim_k);
  }
  if (layer.key_coding == KeyCodingKind::kWhitened) {
    // Each head's key turned back by its position, then whitened.
    const int32_t hd = layer.head_dim_k;
    cos_sin.resize(layer.n_rot);
    RopeFromTable(layer.rope_table, layer.n_rot, position, cos_sin.data());
    for (int32_t i = layer.n_rot / 2; i < layer.n_rot; ++i) cos_sin[i] = -cos_sin[i];
    shifted.resize(static_cast<size_t>(layer.n_head_kv) * hd);
    for (int32_t h = 0; h < layer.n_head_kv; ++h) {
      const size_t at = static_cast<size_t>(h) * hd;
      float key[kMaxWhitenedHeadDim];
      std::copy(k + at, k + at + hd, key);
      ApplyRope(key, cos_sin.data(), layer.n_rot, layer.rope_neox);
      WhitenKey(layer.k_whitening[h], hd, key, shifted.data() + at);
    }
    k = shifted.data();
  } else if (layer.key_coding != KeyCodingKind::kPlain) {
    // Each head's offset as stored: as it is, or turned by RoPE to this position.
    const int32_t hd = layer.head_dim_k;
    const bool follows_rope = layer.key_coding == KeyCodingKind::kRopeOffset;
    if (follows_rope) {
      cos_sin.resize(layer.n_rot);
      RopeFromTable(layer.rope_table, layer.n_rot, position, cos_sin.data());
    }
    shifted.resize(static_cast<size_t>(layer.n_head_kv) * hd);
    offset.resize(hd);
    for (int32_t h = 0; h < layer.n_head_kv; ++h) {
      const size_t at = static_cast<size_t>(h) * hd;
      std::copy(layer.k_offset + at, layer.k_offset + at + hd, offset.begin());
      if (follows_rope) {
        ApplyRope(offset.data(), cos_sin.data(), layer.n_rot, layer.rope_neox);
      }
      for (int32_t d = 0; d < hd; ++d) shifted[at + d] = k[at + d] - offset[d];
    }
    k = shifted.data();
  }
  for (int32_t h = 0; h < layer.n_head_kv; ++h) {
    StoreKey(layer.k_type, kb + h * kh, layer.head_dim_k, pos,
             k + static_cast<size_t>(h) * layer.head_dim_k);
    StoreValue(layer.v_type, vb + h * vh, layer.head_dim_v, pos,
               v + static_cast<size_t>(h) * layer.head_dim_v);
  }
}

void ReadKv(const KvLayerView& layer, int64_t slot, int32_t position, float* k, float* v) {
  const int64_t block = slot / kKvBlockTokens;
  const int32_t pos = static_cast<int32_t>(slot % kKvBlockTokens);
  const uint8_t* kb = layer.k + static_cast<size_t>(block) * layer.k_block_stride();
  const uint8_t* vb = layer.v + static_cast<size_t>(block) * layer.v_block_stride();
  const size_t kh = layer.k_head_bytes(), vh = layer.v_head_bytes();
  const int32_t hk = layer.head_dim_k, hv = layer.head_dim_v;
  thread_local std::vector<float> cos_sin, stored, offset;
  if (layer.NeedsRopeTable()) {
    KVS_CHECK(layer.rope_table != nullptr && position < layer.rope_positions && layer.n_rot > 0 &&
              layer.n_rot <= hk);
    cos_sin.resize(layer.n_rot);
    RopeFromTable(layer.rope_table, layer.n_rot, position, cos_sin.data());
  }
  stored.resize(std::max(hk, hv));
  offset.resize(hk);
  for (int32_t h = 0; h < layer.n_head_kv; ++h) {
    float* key = k + static_cast<size_t>(h) * hk;
    LoadKeyVector(layer.k_type, kb + h * kh, hk, pos, stored.data());
    if (layer.key_coding == KeyCodingKind::kWhitened) {
      // The stored coordinates are whitened and rotated; F undoes both (key_whitening.h).
      UnwhitenKey(layer.k_whitening[h], hk, stored.data(), key);
      ApplyRope(key, cos_sin.data(), layer.n_rot, layer.rope_neox);
    } else {
      if (KvTypeIsRotated(layer.k_type)) RotateBack(stored.data(), hk);
      std::copy(stored.begin(), stored.begin() + hk, key);
      if (layer.key_coding != KeyCodingKind::kPlain) {
        std::copy(layer.k_offset + static_cast<size_t>(h) * hk,
                  layer.k_offset + static_cast<size_t>(h + 1) * hk, offset.begin());
        if (layer.key_coding == KeyCodingKind::kRopeOffset) {
          ApplyRope(offset.data(), cos_sin.data(), layer.n_rot, layer.rope_neox);
        }
        for (int32_t d = 0; d < hk; ++d) key[d] += offset[d];
      }
    }
    float* value = v + static_cast<size_t>(h) * hv;
    LoadValueVector(layer.v_type, vb + h * vh, hv, pos, value);
    if (KvTypeIsRotated(layer.v_type)) RotateBack(value, hv);
  }
}

void GatherKeyRope(const KvLayerView& layer, std::span<const int32_t> positions,
                   std::vector<float>* rows) {
  const int32_t n_rot = layer.n_rot;
  const size_t n_blocks = (positions.size() + kKvBlockTokens - 1) / kKvBlockTokens;
  rows->assign(n_blocks * n_rot * kKvBlockTokens, 0.0f);
  thread_local std::vector<float> cos_sin;
  cos_sin.resize(n_rot);
  for (size_t j = 0; j < positions.size(); ++j) {
    KVS_CHECK(positions[j] >= 0 && positions[j] < layer.rope_positions);
    RopeFromTable(layer.rope_table, n_rot, positions[j], cos_sin.data());
    float* block = rows->data() + (j / kKvBlockTokens) * n_rot * kKvBlockTokens;
    for (int32_t r = 0; r < n_rot; ++r) block[r * kKvBlockTokens + j % kKvBlockTokens] = cos_sin[r];
  }
}

namespace {

// Slots [src, src + len) to [dst, dst + len), within one kernel block on each side.
void MoveKvRun(const KvLayerView& layer, int64_t src, int64_t dst, int32_t len) {
  if (src == dst) return;
  const size_t kh = layer.k_head_bytes(), vh = layer.v_head_bytes();
  const auto at = [](int64_t slot, size_t stride, uint8_t* base) {
    return base + static_cast<size_t>(slot / kKvBlockTokens) * stride;
  };
  uint8_t* ks = at(src, layer.k_block_stride(), layer.k);
  uint8_t* kd = at(dst, layer.k_block_stride(), layer.k);
  uint8_t* vs = at(src, layer.v_block_stride(), layer.v);
  uint8_t* vd = at(dst, layer.v_block_stride(), layer.v);
  const int32_t ps = static_cast<int32_t>(src % kKvBlockTokens);
  const int32_t pd = static_cast<int32_t>(dst % kKvBlockTokens);
  for (int32_t h = 0; h < layer.n_head_kv; ++h) {
    MoveKey(layer.k_type, ks + h * kh, ps, kd + h * kh, pd, layer.head_dim_k, len);
    MoveValue(layer.v_type, vs + h * vh, ps, vd + h * vh, pd, layer.head_dim_v, len);
  }
}

}  // namespace

void MoveKvSlot(const KvLayerView& layer, int64_t src, int64_t dst) {
  MoveKvSlots(layer, src, dst, 1);
}

void MoveKvSlots(const KvLayerView& layer, int64_t src, int64_t dst, int64_t len) {
  while (len > 0) {
    const int64_t n = std::min({len, int64_t{kKvBlockTokens} - src % kKvBlockTokens,
                                int64_t{kKvBlockTokens} - dst % kKvBlockTokens});
    MoveKvRun(layer, src, dst, static_cast<int32_t>(n));
    src += n;
    dst += n;
    len -= n;
  }
}

void CopyKvBlocks(const KvLayerView& layer, int64_t src, int64_t dst, int32_t n) {
  const size_t ks = layer.k_block_stride(), vs = layer.v_block_stride();
  std::memmove(layer.k + static_cast<size_t>(dst) * ks, layer.k + static_cast<size_t>(src) * ks,
               n * ks);
  std::memmove(layer.v + static_cast<size_t>(dst) * vs, layer.v + static_cast<size_t>(src) * vs,
               n * vs);
}

}  // namespace kvs
