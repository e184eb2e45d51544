#include "engine/key_offsets.h"

#include <algorithm>

#include "core/check.h"
#include "engine/kv_format_factory.h"
#include "kernels/kv_quant.h"
#include "kernels/ops.h"
#include "kv/kv_storage.h"

namespace kvs {

namespace {

// Ordinary narrative prose: what most prompts look like to a model, and nothing model-specific.
constexpr char kCalibrationText[] =
    "On a quiet morning the old man walked down to the harbour, as he had done every day for "
    "forty years. The boats were already out, and the water was calm and grey. He sat on the "
    "bench by the wall, opened his bag and took out a small loaf of bread. A girl came running "
    "along the pier with her dog, laughing, and asked him whether the fishermen would be back "
    "before lunch. He smiled and said that they always came back when the tide turned.";

}  // namespace

std::vector<int32_t> KeyCalibrationTokens(const Tokenizer* tokenizer, int32_t n_vocab) {
  constexpr size_t kMaxTokens = 64;
  std::vector<int32_t> tokens;
  if (tokenizer != nullptr) {
    tokens = tokenizer->Encode(kCalibrationText, /*add_special=*/true, /*parse_special=*/false);
  }
  if (tokens.size() < 16) {
    tokens.resize(kMaxTokens);
    for (size_t i = 0; i < kMaxTokens; ++i) {
      tokens[i] = static_cast<int32_t>((static_cast<uint64_t>(i + 1) * 2654435761u) % n_vocab);
    }
  }
  if (tokens.size() > kMaxTokens) tokens.resize(kMaxTokens);
  return tokens;
}

KeyCoding MeasureKeyCoding(const Model& model, ThreadPool& pool, const std::vector<int32_t>& tokens,
                           KvType k_type, int32_t context) {
  auto run = CalibrationPrefill::Run(model, pool, tokens, /*with_queries=*/false);
  KVS_CHECK_MSG(run.ok(), "key calibration run failed");
  return MeasureKeyCoding(model, **run, k_type, context);
}

KeyCoding MeasureKeyCoding(const Model& model, const CalibrationPrefill& run, KvType k_type,
                           int32_t context) {
  const ModelConfig& c = model.config();
  const int32_t n_tokens = run.n_tokens();
  const KvStorage& storage = run.storage();
  const std::vector<int32_t>& blocks = run.blocks();

  // The calibration keys before RoPE (each turned back by its position): [token][layer][head][hk].
  // Model-wide codings need one RoPE for every layer (MakeKvFormat refuses a model without).
  KVS_CHECK_MSG(c.uniform_rope() != nullptr, "key calibration needs one RoPE for all layers");
  const RopeParams rope = model.Rope(0);
  const int32_t hk = c.head_dim_k, n_rot = rope.n_rot;
  const size_t n_heads = static_cast<size_t>(c.n_layer) * c.n_head_kv;
  std::vector<float> cos_sin(n_rot), keys(static_cast<size_t>(n_tokens) * n_heads * hk);
  std::vector<double> mean_pre(n_heads * hk, 0.0);
  for (int32_t p = 0; p < n_tokens; ++p) {
    RopeAngles(p, rope, cos_sin.data());
    for (int32_t i = n_rot / 2; i < n_rot; ++i) cos_sin[i] = -cos_sin[i];  // rotate by -p
    for (size_t head = 0; head < n_heads; ++head) {
      const KvHeadView view = storage.layers()[head / c.n_head_kv].Head(
          static_cast<int32_t>(head % c.n_head_kv), blocks.data());
      float* key = keys.data() + (static_cast<size_t>(p) * n_heads + head) * hk;
      for (int32_t d = 0; d < hk; ++d) {
        key[d] =
            LoadKey(KvType::kF32, KeyBlock(view, p / kKvBlockTokens), hk, d, p % kKvBlockTokens);
      }
      ApplyRope(key, cos_sin.data(), n_rot, rope.neox);
      for (int32_t d = 0; d < hk; ++d) mean_pre[head * hk + d] += key[d] / n_tokens;
    }
  }
  KeyCoding coding;
  if (KvKeysWhitened(k_type, hk)) {
    for (size_t head = 0; head < n_heads; ++head) {
      coding.whitening.push_back(
          FitKeyWhitening(keys.data() + head * hk, n_tokens, n_heads * hk, hk));
    }
    return coding;
  }
  if (KvKeyOffsetFollowsRope(k_type)) {
    coding.offsets.assign(mean_pre.begin(), mean_pre.end());
    return coding;
  }
  // One constant offset for positions 0..context-1: the common part turned by each of them,
  // averaged. RoPE is linear in its cos/sin, so turn it by the averaged cos/sin.
  const int32_t n_pos = std::clamp(context, 1, 1 << 17);
  std::vector<double> avg(n_rot, 0.0);
  for (int32_t p = 0; p < n_pos; ++p) {
    RopeAngles(p, rope, cos_sin.data());
    for (int32_t i = 0; i < n_rot; ++i) avg[i] += cos_sin[i] / n_pos;
  }
  for (int32_t i = 0; i < n_rot; ++i) cos_sin[i] = static_cast<float>(avg[i]);
  coding.offsets.resize(mean_pre.size());
  for (size_t head = 0; head < n_heads; ++head) {
    float* o = coding.offsets.data() + head * hk;
    for (int32_t d = 0; d < hk; ++d) o[d] = static_cast<float>(mean_pre[head * hk + d]);
    ApplyRope(o, cos_sin.data(), n_rot, rope.neox);
  }
  return coding;
}

}  // namespace kvs
