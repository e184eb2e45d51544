// How a quantized K cache codes keys (KeyCoding): the per-head key offsets it subtracts, or the
// whitening of small heads, from the keys of a fixed calibration run.
// Keys of trained models share a large common component (stories260K's mean key is 2-3x the
// spread between its keys) and vary far more along some directions than others; quantizing
// without regard to either spends the codes on what attention ignores.
#pragma once

#include <vector>

#include "core/thread_pool.h"
#include "engine/calibration_prefill.h"
#include "kernels/kv_types.h"
#include "kv/kv_format.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace kvs {

// The calibration stream: a fixed paragraph of plain English prose, tokenized (at most 64
// tokens, BOS first where the model adds one). Without a tokenizer: fixed pseudo-random ids.
std::vector<int32_t> KeyCalibrationTokens(const Tokenizer* tokenizer, int32_t n_vocab);

// How keys of type k_type are coded, from the calibration tokens' keys before RoPE (each turned
// back by its position), whose mean per (layer, KV head) is m:
//  - whitened (KvKeysWhitened: 4- and 3-bit keys of heads up to 16 dims): each head's mean and
//    covariance give its KeyWhitening;
//  - otherwise offsets [n_layer][n_head_kv][head_dim_k]. Where the offset follows RoPE
//    (KvKeyOffsetFollowsRope) that is m itself: the cache stores a key at position p less m
//    turned to p, exact at every position. Otherwise it is m turned by each position of
//    [0, context), averaged: the best constant offset for a cache of that context (RoPE turns
//    the common part slowly in its low-frequency dims, so much of it survives the average).
// Deterministic for a model, type and context: caches built alike store interchangeable blocks.
KeyCoding MeasureKeyCoding(const Model& model, ThreadPool& pool, const std::vector<int32_t>& tokens,
                           KvType k_type, int32_t context);
// The same from a prefill of the calibration tokens already made (calibration_prefill.h).
KeyCoding MeasureKeyCoding(const Model& model, const CalibrationPrefill& run, KvType k_type,
                           int32_t context);

}  // namespace kvs
