// The per-head key offsets a quantized K cache subtracts, turned by RoPE to each key's position,
// before it stores a key (see KvLayerView::k_offset): the mean pre-RoPE key of each (layer, KV
// head) over a fixed calibration run.
// Keys of trained models share a large common component (stories260K's mean key is 2-3x the
// spread between its keys); quantizing without it spends the codes on what attention ignores.
#pragma once

#include <vector>

#include "core/thread_pool.h"
#include "kernels/kv_types.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace kvs {

// The calibration stream: a fixed paragraph of plain English prose, tokenized (at most 64
// tokens, BOS first where the model adds one). Without a tokenizer: fixed pseudo-random ids.
std::vector<int32_t> KeyCalibrationTokens(const Tokenizer* tokenizer, int32_t n_vocab);

// [n_layer][n_head_kv][head_dim_k]: the offsets for keys of type k_type, from the mean key of the
// calibration tokens before RoPE (each key turned back by its position), m. Where the offset
// follows RoPE (KvKeyOffsetFollowsRope) that is m itself: the cache stores a key at position p
// less m turned to p, exact at every position. Otherwise it is m turned by each position of
// [0, context), averaged: the best constant offset for a cache of that context (RoPE turns the
// common part slowly in its low-frequency dims, so much of it survives the average).
// Deterministic for a model, type and context: caches built alike store interchangeable blocks.
std::vector<float> MeasureKeyOffsets(const Model& model, ThreadPool& pool,
                                     const std::vector<int32_t>& tokens, KvType k_type,
                                     int32_t context);

}  // namespace kvs
