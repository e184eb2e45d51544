// The one place a KV format (kv/kv_format.h) is made for a model: the geometry from its config,
// RoPE from its weights, and, for quantized K types, the key coding measured on calibration
// text (key_offsets.h). The API, perplexity, every bench and the tests all come through here.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "engine/calibration_prefill.h"
#include "kv/kv_cache_manager.h"
#include "kv/kv_format.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace kvs {

// The K/V geometry of a model's cache with the given pool block size.
KvGeometry ModelKvGeometry(const ModelConfig& config, int32_t block_size, KvTypes types = {});
// RoPE as the model applies it, by value.
KvRope ModelKvRope(const Model& model);

// The most calibration tokens read from a user's file: one prefill of this many tokens.
inline constexpr size_t kMaxCalibrationTokens = 512;

struct KvFormatOptions {
  KvTypes types;
  int32_t block_size = 16;
  // The context a constant key offset (8-bit K types) is averaged over: part of the format.
  int32_t n_ctx = 4096;
  // Measure the key coding of a quantized K type (false: plain quantized keys, for ablations
  // and tests).
  bool calibrate = true;
  // The tokens keys are measured on; empty: the built-in paragraph (KeyCalibrationTokens).
  std::vector<int32_t> calibration_tokens;
  std::string calibration_source = "built-in paragraph";
  // The calibration tokens also fit a tier's transform codec (no warning when K is unquantized).
  bool transform_codec = false;
};

// Options with these types and every other field at its default.
inline KvFormatOptions KvFormatWithTypes(KvTypes types) {
  KvFormatOptions options;
  options.types = types;
  return options;
}

// The most calibration tokens --kv-calibration-tokens may ask for (the transform codec's fit;
// key codings use the first kMaxCalibrationTokens).
inline constexpr int32_t kMaxCalibrationTokensFlag = 65536;

// Calibrates on a user's text (--kv-calibration FILE): sets options' calibration tokens to its
// first max_tokens (BOS first where the model adds one) and its source to the path.
// An unreadable or too short file is an error, and options are left as they were.
Status UseCalibrationFile(const std::string& path, const Tokenizer& tokenizer,
                          KvFormatOptions* options,
                          int32_t max_tokens = static_cast<int32_t>(kMaxCalibrationTokens));

// The prefix-cache key of a model's blocks: what their bytes depend on besides the tokens — the
// weights (their digest), the KV format (its fingerprint; the block size again, explicitly)
// and the request's cache salt.
BlockHash ModelCacheKey(const Digest128& weights, const KvFormat& format, std::string_view salt);

// The warning for --kv-calibration given with a K type that is not calibrated.
void WarnCalibrationUnused(KvType k_type);

// Logs one line when it calibrates (what, on which text, how long it took).
// runs: where the calibration prefill comes from (shared with the other calibrations), or null.
Expected<KvFormatPtr> MakeKvFormat(const Model& model, const Tokenizer* tokenizer, ThreadPool& pool,
                                   const KvFormatOptions& options, CalibrationRuns* runs = nullptr);

}  // namespace kvs
