// One layer of the paged KV cache as the kernels see it: keys and values of the layer's types in
// blocks of kKvBlockTokens positions (the attention kernel's block), each block one head block
// (kv_types.h) per KV head:
//   keys   [kernel_block][n_head_kv][head block of k_type]
//   values [kernel_block][n_head_kv][head block of v_type]
// A pool block of block_size = m * 16 positions is m consecutive kernel blocks, so a slot s (pool
// block * block_size + offset) is kernel block s / 16, position s % 16, whatever the block size.
// The storage (kv/kv_storage.h) fills these views from its KV format; kernels only read them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/attention.h"
#include "kernels/key_whitening.h"
#include "kernels/kv_types.h"

namespace kvs {

// How keys are stored; the attention kernel has one key path per kind (attention.cc).
enum class KeyCodingKind {
  kPlain,           // as the model wrote them (after RoPE)
  kConstantOffset,  // less one vector per head (8-bit types): softmax ignores the shift
  kRopeOffset,      // less the head's mean key turned to the key's position (4-/3-bit types)
  kWhitened,        // whitened before RoPE (4-/3-bit types at head_dim <= 16)
};
const char* KeyCodingKindName(KeyCodingKind kind);
// The kind a K type at this head size uses once calibrated (kPlain for unquantized types).
KeyCodingKind KeyCodingKindFor(KvType k_type, int32_t head_dim_k);

struct KvLayerView {
  uint8_t* k = nullptr;
  uint8_t* v = nullptr;
  int32_t n_head_kv = 0;
  int32_t head_dim_k = 0;
  int32_t head_dim_v = 0;
  KvType k_type = KvType::kF32;
  KvType v_type = KvType::kF32;
  KeyCodingKind key_coding = KeyCodingKind::kPlain;
  // [n_head_kv][head_dim_k] for the offset codings: subtracted from every key before it is
  // stored, so that a quantized type spends its codes on what differs between keys rather than
  // on their common part (engine/key_offsets.h):
  //  - kRopeOffset: each head's mean key before RoPE, m; a key at position p is stored less
  //    R(p)·m and attention adds q·R(p)·m back to its score (KvHeadView::k_offset);
  //  - kConstantOffset: subtracted as it is; attention needs nothing back, since a query's
  //    scores all shift by the same q·offset and softmax ignores that.
  const float* k_offset = nullptr;
  // [n_head_kv] for kWhitened: keys are stored whitened before RoPE (key_whitening.h).
  const KeyWhitening* k_whitening = nullptr;
  // RopeTable (attention.h) of positions [0, rope_positions), for the RoPE-dependent codings.
  const float* rope_table = nullptr;
  int32_t rope_positions = 0;
  int32_t n_rot = 0;
  bool rope_neox = false;

  // Whether writes and attention need the cos/sin of each key's position.
  bool NeedsRopeTable() const {
    return key_coding == KeyCodingKind::kRopeOffset || key_coding == KeyCodingKind::kWhitened;
  }
  size_t k_head_bytes() const { return KvHeadBlockBytes(k_type, head_dim_k); }
  size_t v_head_bytes() const { return KvHeadBlockBytes(v_type, head_dim_v); }
  size_t k_block_stride() const { return static_cast<size_t>(n_head_kv) * k_head_bytes(); }
  size_t v_block_stride() const { return static_cast<size_t>(n_head_kv) * v_head_bytes(); }
  // KV head g over the kernel blocks listed in kernel_block_ids. key_rope: the RopeTable rows of
  // those keys in list order (key j at row j), or null when key j sits at position j, so the
  // layer's own table serves.
  KvHeadView Head(int32_t g, const int32_t* kernel_block_ids,
                  const float* key_rope = nullptr) const {
    KvHeadView view;
    view.k_base = k + static_cast<size_t>(g) * k_head_bytes();
    view.v_base = v + static_cast<size_t>(g) * v_head_bytes();
    view.k_block_stride = k_block_stride();
    view.v_block_stride = v_block_stride();
    view.block_ids = kernel_block_ids;
    view.k_type = k_type;
    view.v_type = v_type;
    if (key_coding == KeyCodingKind::kWhitened) view.k_whitening = k_whitening + g;
    if (key_coding == KeyCodingKind::kRopeOffset) {
      view.k_offset = k_offset + static_cast<size_t>(g) * head_dim_k;
    }
    if (NeedsRopeTable()) {
      view.rope_table = key_rope != nullptr ? key_rope : rope_table;
      view.n_rot = n_rot;
      view.rope_neox = rope_neox;
    }
    return view;
  }
};

// Stores (quantizes) the keys [n_head_kv][head_dim_k] and values [n_head_kv][head_dim_v] of the
// token at RoPE position pos in slot (which need not be pos: positions are not slots). Positions
// that share a kernel block must be written by one thread: sub-byte codes of neighbouring
// positions share bytes.
void WriteKv(const KvLayerView& layer, int64_t slot, int32_t pos, const float* k, const float* v);

// Reads back what WriteKv stored in slot at RoPE position pos: the keys [n_head_kv][head_dim_k]
// as the model wrote them (after RoPE) and the values [n_head_kv][head_dim_v], whatever the
// types and key coding (a quantized type's codes dequantized, its rotation and the coding's
// offset or whitening undone). What a codec that re-codes stored blocks (the transform codec of
// the cold tiers) starts from.
void ReadKv(const KvLayerView& layer, int64_t slot, int32_t pos, float* k, float* v);

// The RoPE rows of keys at these positions, key j at row j (KvHeadView::rope_table), read from
// the layer's table, which must cover them: what attention needs once keys sit in other slots
// than their positions. rows is resized to whole blocks of 16.
void GatherKeyRope(const KvLayerView& layer, std::span<const int32_t> positions,
                   std::vector<float>* rows);

// Moves the K/V of slot src to slot dst, every head of one layer, as bytes (codes and scales,
// never requantized: MoveKey/MoveValue). The key keeps the RoPE position it was written at, which
// attention must be told (BatchSequence::key_positions). What compaction does per kept slot.
void MoveKvSlot(const KvLayerView& layer, int64_t src, int64_t dst);
// The same for slots [src, src + len) to [dst, dst + len), dst <= src, as few byte copies as the
// kernel blocks allow (a run is split where it crosses a block on either side).
void MoveKvSlots(const KvLayerView& layer, int64_t src, int64_t dst, int64_t len);

// Copies n kernel blocks starting at src to the n starting at dst (one layer). The ranges may
// overlap: compaction moves a run of blocks down over its own tail.
void CopyKvBlocks(const KvLayerView& layer, int64_t src, int64_t dst, int32_t n);

}  // namespace kvs
