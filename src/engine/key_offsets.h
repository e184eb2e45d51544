// The per-head key offsets a quantized K cache subtracts before it stores a key (see
// KvLayerView::k_offset): the mean key of each (layer, KV head) over a fixed calibration run.
// Keys of trained models share a large common component (stories260K's mean key is 2-3x the
// spread between its keys); quantizing without it spends the codes on what attention ignores.
#pragma once

#include <vector>

#include "core/thread_pool.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace kvs {

// The calibration stream: a fixed paragraph of plain English prose, tokenized (at most 64
// tokens, BOS first where the model adds one). Without a tokenizer: fixed pseudo-random ids.
std::vector<int32_t> KeyCalibrationTokens(const Tokenizer* tokenizer, int32_t n_vocab);

// [n_layer][n_head_kv][head_dim_k]: the mean post-RoPE key of the calibration tokens placed at
// positions spread evenly over [0, context). RoPE turns a key's common part with the position
// (slowly in its low-frequency dims), so the offset that serves a cache best is the mean over the
// positions the cache will hold. Deterministic for a model and context: every cache built with
// the same ones gets the same offsets, so cached blocks stay interchangeable.
std::vector<float> MeasureKeyOffsets(const Model& model, ThreadPool& pool,
                                     const std::vector<int32_t>& tokens, int32_t context);

}  // namespace kvs
