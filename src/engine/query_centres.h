// The tri eviction policy's calibration (kv/tri_policy.h): where each head's queries sit before
// RoPE, from one forward pass over a fixed calibration stream, and the model's RoPE angles.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "engine/calibration_prefill.h"
#include "kv/tri_policy.h"
#include "model/weights.h"

namespace kvs {

// Runs the model over `tokens` (KeyCalibrationTokens: a plain paragraph, at most 64 tokens) and
// returns each (layer, query head)'s mean query before RoPE (each query turned back by its
// position) and the per-position angle of every rotated pair, computed as RopeAngles does
// (freq_base, freq_scale and the model's rope_freqs). Deterministic for a model and tokens.
// Errors: no tokens, or a token the forward pass rejects.
Expected<std::shared_ptr<const TriCalibration>> MeasureTriCalibration(
    const Model& model, ThreadPool& pool, const std::vector<int32_t>& tokens);
// The same from a prefill of the tokens already made with its queries (calibration_prefill.h).
Expected<std::shared_ptr<const TriCalibration>> MeasureTriCalibration(
    const Model& model, const CalibrationPrefill& run);

}  // namespace kvs
