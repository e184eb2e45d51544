#include "engine/kv_format_factory.h"

#include <chrono>
#include <utility>

#include "core/log.h"
#include "core/text_file.h"
#include "engine/key_offsets.h"

namespace kvs {

KvGeometry ModelKvGeometry(const ModelConfig& c, int32_t block_size, KvTypes types) {
  return KvGeometry{c.n_layer,  c.n_head_kv, c.head_dim_k, c.head_dim_v,
                    block_size, types.k,     types.v};
}

KvRope ModelKvRope(const Model& model) {
  // The key codings that depend on RoPE are model-wide: MakeKvFormat calibrates them only for
  // a model whose layers share one RoPE.
  const RopeSpec& r = model.config().ropes[0];
  return KvRope{r.n_rot, r.freq_base, r.freq_scale, r.neox,
                r.freq_factors ? model.weights().rope_freqs : std::vector<float>{}};
}

Status UseCalibrationFile(const std::string& path, const Tokenizer& tokenizer,
                          KvFormatOptions* options, int32_t max_tokens) {
  if (max_tokens < 16 || max_tokens > kMaxCalibrationTokensFlag) {
    return Status::Error(StrFormat("--kv-calibration-tokens %d: expected 16..%d", max_tokens,
                                   kMaxCalibrationTokensFlag));
  }
  auto text = ReadTextFile(path, int64_t{64} << 20);
  if (!text.ok()) return Status::Error("--kv-calibration: " + text.error());
  // A token of prose takes a few bytes: tokenize a prefix, cut at a space, not a whole 64 MiB
  // file.
  const size_t kPrefixBytes = std::max<size_t>(64 << 10, static_cast<size_t>(max_tokens) * 16);
  std::string_view prefix = *text;
  if (prefix.size() > kPrefixBytes) {
    const size_t cut = prefix.rfind(' ', kPrefixBytes);
    prefix = prefix.substr(0, cut == std::string_view::npos || cut == 0 ? kPrefixBytes : cut);
  }
  std::vector<int32_t> tokens =
      tokenizer.Encode(prefix, /*add_special=*/true, /*parse_special=*/false);
  if (tokens.size() > static_cast<size_t>(max_tokens)) tokens.resize(max_tokens);
  if (tokens.size() < 16) {
    return Status::Error(
        StrFormat("--kv-calibration %s: %zu tokens; the key statistics need at least 16",
                  path.c_str(), tokens.size()));
  }
  options->calibration_tokens = std::move(tokens);
  options->calibration_source = path;
  return Status::Ok();
}

BlockHash ModelCacheKey(const Digest128& weights, const KvFormat& format, std::string_view salt) {
  return PrefixCacheKey(
      "weights:" + weights.Hex(),
      StrFormat("kv:%s|block:%d", format.fingerprint().Hex().c_str(), format.block_size()), salt);
}

void WarnCalibrationUnused(KvType k_type) {
  KVS_LOG_WARN(
      "--kv-calibration has no effect: keys of type %s are not calibrated (only quantized "
      "K types are)",
      std::string(KvTypeName(k_type)).c_str());
}

Expected<KvFormatPtr> MakeKvFormat(const Model& model, const Tokenizer* tokenizer, ThreadPool& pool,
                                   const KvFormatOptions& options, CalibrationRuns* runs) {
  const ModelConfig& c = model.config();
  const KvGeometry geometry = ModelKvGeometry(c, options.block_size, options.types);
  KVS_RETURN_IF_ERROR(geometry.Validate());
  const KvRope rope = ModelKvRope(model);
  if (!KvTypeIsQuantized(options.types.k) || !options.calibrate) {
    if (!options.calibration_tokens.empty() && !options.transform_codec) {
      WarnCalibrationUnused(options.types.k);
    }
    return KvFormat::Make(geometry, rope, {}, {});
  }
  if (c.uniform_rope() == nullptr) {
    return Status::Error(StrFormat(
        "%s keys are calibrated for the model as a whole, which needs one RoPE for every layer; "
        "this model's layers have %zu: use f16, bf16 or f32 keys",
        std::string(KvTypeName(options.types.k)).c_str(), c.ropes.size()));
  }
  const auto t0 = std::chrono::steady_clock::now();
  KvCalibration calibration;
  std::vector<int32_t> tokens = options.calibration_tokens;
  calibration.source = options.calibration_source;
  // Key codings measure one prefill: the first kMaxCalibrationTokens.
  if (tokens.size() > kMaxCalibrationTokens) tokens.resize(kMaxCalibrationTokens);
  if (tokens.empty()) {
    tokens = KeyCalibrationTokens(tokenizer, c.n_vocab);
    if (tokenizer == nullptr) calibration.source = "fixed pseudo-random tokens";
  }
  for (int32_t t : tokens) {
    if (t < 0 || t >= c.n_vocab) return Status::Error("calibration token outside the vocabulary");
  }
  calibration.tokens = DigestBytes(tokens.data(), tokens.size() * sizeof(int32_t));
  calibration.offset_context = options.n_ctx;
  KeyCoding coding;
  if (runs != nullptr) {
    auto run = runs->Get(tokens, /*with_queries=*/false);
    if (!run.ok()) return run.status();
    coding = MeasureKeyCoding(model, **run, options.types.k, options.n_ctx);
  } else {
    coding = MeasureKeyCoding(model, pool, tokens, options.types.k, options.n_ctx);
  }
  calibration.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto format = KvFormat::Make(geometry, rope, std::move(coding), std::move(calibration));
  if (!format.ok()) return format;
  const KvFormat& f = **format;
  KVS_LOG_INFO("kv: %s keys calibrated (%s) on the %s, %zu tokens, in %.0f ms",
               std::string(KvTypeName(options.types.k)).c_str(),
               KeyCodingKindName(f.key_coding_kind()), f.calibration().source.c_str(),
               tokens.size(), 1e3 * f.calibration().seconds);
  return format;
}

}  // namespace kvs
