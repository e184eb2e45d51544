// Attention of queries over keys and values kept in blocks of 16 positions (the layout of the
// paged KV cache), in any KV type (kv_types.h): for one KV head, block b holds
//   keys   [head_dim_k][16]  (transposed: one 16-lane vector per dimension, so a query's 16
//                             scores are head_dim_k broadcast FMAs, no horizontal sums)
//   values [16][head_dim_v]  (rows: a probability times a row is a run of FMAs)
// each followed by its group scales. The kernel walks a query tile over the key blocks once,
// widening one block at a time in registers, with an online softmax (running max and sum per
// query); it never materialises a score row as long as the context, nor a dequantized cache.
// Group scales factor out of the sums: a key group's partial dot products are scaled once per
// group, a value row's codes once per row. For rotated types the queries are rotated on entry
// and the outputs rotated back on exit.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/key_whitening.h"
#include "kernels/kv_types.h"
#include "kernels/ops.h"

namespace kvs {

inline constexpr int kKvBlockTokens = 16;

// Where one KV head's blocks are: logical block i is physical block block_ids[i], whose keys
// start at k_base + id * k_block_stride and values at v_base + id * v_block_stride (bytes).
struct KvHeadView {
  const uint8_t* k_base = nullptr;
  const uint8_t* v_base = nullptr;
  size_t k_block_stride = 0;
  size_t v_block_stride = 0;
  const int32_t* block_ids = nullptr;
  KvType k_type = KvType::kF32;
  KvType v_type = KvType::kF32;
  // Keys may be stored less R(p)·m: the head's mean key before RoPE, m, turned to each key's own
  // position p (KvLayerView::k_offset). Scores then owe q·R(p)·m, which is added per block from
  // the RoPE table: per query one coefficient per table row, per block n_rot FMAs.
  const float* k_offset = nullptr;  // [head_dim_k] m, or null: keys stored as they are
  // Or keys stored whitened before RoPE (key_whitening.h): each block is decoded to f32 keys,
  // turned by RoPE from the table, and scored against the queries as given.
  const KeyWhitening* k_whitening = nullptr;
  // RopeTable layout, row j holding the cos/sin of key j's position (in block_ids order), at
  // least max_keys rows: the positions' own table while key j sits at position j; a gathered
  // one when keys were moved to other slots (positions are not slots).
  const float* rope_table = nullptr;
  int32_t n_rot = 0;
  bool rope_neox = false;
};

// cos and sin of every rotated pair at positions [0, 16 * n_blocks), 16 positions to a block:
//   table [block][n_rot][16]: rows 0..n_rot/2-1 cos(p * theta_i), rows n_rot/2.. sin(p * theta_i)
// (the row order of RopeAngles's cos_sin, laid out for 16-lane loads).
inline const float* RopeTableBlock(const float* table, int32_t n_rot, int32_t block) {
  return table + static_cast<size_t>(block) * n_rot * kKvBlockTokens;
}
// Writes blocks [first_block, first_block + n_blocks) of the table, at table[first_block].
void FillRopeTable(const RopeParams& rope, int32_t first_block, int32_t n_blocks, float* table);
// cos_sin[n_rot] of position pos, read back from the table (RopeAngles's layout).
void RopeFromTable(const float* table, int32_t n_rot, int32_t pos, float* cos_sin);

struct AttentionShape {
  int32_t head_dim_k = 0;
  int32_t head_dim_v = 0;
  float scale = 1.0f;  // applied to q.k (1/sqrt(head_dim_k))
};

// out[i][0, head_dim_v) = softmax_j(scale * q[i].k[j]) . v[j] over keys first_key[i] <= j <
// n_keys[i], for i < n_queries. Queries that see similar numbers of keys should be adjacent: up
// to 32 of them (tiles of four) walk the key blocks together, each block read from memory once
// for them all. first_key null: every query's keys start at 0 (global attention); else a
// sliding window's first key, 0 <= first_key[i] < n_keys[i]. Keys from the block of the
// smallest first_key up to the largest n_keys must have been written (values outside a query's
// own range get weight exactly 0, never a NaN from garbage); blocks wholly before every query's
// first key are never read, so a sliding window's freed blocks may be anything.
void Attend(const AttentionShape& shape, const KvHeadView& kv, const float* const* q,
            const int32_t* n_keys, int n_queries, float* const* out,
            const int32_t* first_key = nullptr);

// Split-K ("flash-decoding"): a query's keys are taken in partitions of kKeyPartitionBlocks key
// blocks at fixed positions ([0, 1024), [1024, 2048), ...), each folded into a partial state of
// its own, and the partials merged in partition order. Attend does both on the calling thread; a
// caller may instead spread a sequence's partitions (and its heads) over threads with
// AttendPartition and merge them with MergePartitions. The outputs are bit-identical either way,
// whatever tiles, threads or batch a query is in (decode and the verification of drafts agree).
inline constexpr int32_t kKeyPartitionBlocks = 64;
inline constexpr int32_t kKeyPartitionKeys = kKeyPartitionBlocks * kKvBlockTokens;
inline int32_t KeyPartitions(int32_t n_keys) {
  return (n_keys + kKeyPartitionKeys - 1) / kKeyPartitionKeys;
}
// Floats per partial output row: head_dim_v rounded up to 16.
inline size_t AttentionPartialStride(const AttentionShape& shape) {
  return static_cast<size_t>(shape.head_dim_v + 15) / 16 * 16;
}

// A query's partial state over one partition of its keys, s_j its scaled scores there:
// m = max_j s_j, l = sum_j exp(s_j - m), o = sum_j exp(s_j - m) v_j (in the values' stored
// basis). A query without keys in the partition has m = -inf, l = 0, o = 0.
struct AttentionPartials {
  float* o = nullptr;  // [rows][AttentionPartialStride]
  float* m = nullptr;  // [rows]
  float* l = nullptr;  // [rows]
};

// Partition `part` of the keys for the queries of n_heads KV heads: q[h * n + i] is query i of
// head h (its keys and values in heads[h]; every head's views share one KV type and key coding),
// seeing keys [first_key[i], n_keys[i]) (first_key null: from 0); n <= 32. Writes row h * n + i
// of out (a partition before a query's first key leaves it empty: m = -inf, l = 0, o = 0). The
// heads' tiles walk the key blocks side by side, so heads whose blocks are adjacent (the paged
// cache's layout, kv_layer.h) are read as one stream, which the hardware prefetcher follows.
void AttendPartition(const AttentionShape& shape, const KvHeadView* heads, int n_heads,
                     const float* const* q, const int32_t* n_keys, int n, int32_t part,
                     const AttentionPartials& out, const int32_t* first_key = nullptr);

// out[head_dim_v]: one query's output from its KeyPartitions(n_keys) partials, partial p at
// o + p * o_stride, m[p * ml_stride], l[p * ml_stride], merged in partition order (rotated back
// when v_type is rotated).
void MergePartitions(const AttentionShape& shape, KvType v_type, int32_t n_parts, const float* o,
                     size_t o_stride, const float* m, const float* l, size_t ml_stride, float* out);

// Scalar twin in double with a plain two-pass softmax over the scalar dequantizers of
// kv_quant.h. Tests only.
void AttendReference(const AttentionShape& shape, const KvHeadView& kv, const float* const* q,
                     const int32_t* n_keys, int n_queries, float* const* out,
                     const int32_t* first_key = nullptr);

// mass[j] += sum over queries i of softmax_i(j), for j < n_keys[i]: the attention each key
// receives, what eviction's h2o and snapkv policies score by (kv/eviction_policy.h). The keys
// are decoded once (LoadKeys) for all the queries, then scored in float: a second pass over the
// keys the fused kernel never materialises, paid only for sequences whose policy asks for it.
void AttentionMass(const AttentionShape& shape, const KvHeadView& kv, const float* const* q,
                   const int32_t* n_keys, int n_queries, float* mass);

// keys[n_keys][head_dim_k]: keys 0..n_keys of one head as the model wrote them (after RoPE),
// decoded by the head's key coding (a RoPE-following offset added back, whitened keys
// unwhitened and turned). A constant offset (KeyCodingKind::kConstantOffset) is not in the view:
// the caller adds it back. What attention-free eviction policies read (kv/eviction_policy.h).
void LoadKeys(const KvHeadView& kv, int32_t head_dim_k, int32_t n_keys, float* keys);

// Logical block i of one head: the head blocks of its keys and values.
inline const uint8_t* KeyBlock(const KvHeadView& kv, int32_t i) {
  return kv.k_base + static_cast<size_t>(kv.block_ids[i]) * kv.k_block_stride;
}
inline const uint8_t* ValueBlock(const KvHeadView& kv, int32_t i) {
  return kv.v_base + static_cast<size_t>(kv.block_ids[i]) * kv.v_block_stride;
}

}  // namespace kvs
