// Gemma 3, as llama.cpp's converter writes it (general.architecture "gemma3"): five local layers
// (a sliding window of attention.sliding_window positions, their own RoPE base
// rope.freq_base_swa, 10,000 by default, never scaled) to every global one (the sixth, unless
// attention.sliding_window_pattern says otherwise; rope.freq_base with the file's linear
// scaling); per-head RMS norms of Q and K; RMS norms before and after each sublayer; GeGLU with
// the tanh GELU; the embedding scaled by sqrt(n_embd); the output tied to the embedding unless
// the file has one. The norms' weights are stored as 1 + w (the converter adds the one), so they
// are plain RMS norms here.
#include <algorithm>
#include <cmath>

#include "model/arch/architecture.h"

namespace kvs {

Status ReadGemma3(const MetadataReader& meta, ModelConfig* c) {
  KVS_RETURN_IF_ERROR(ReadTransformerDims(meta, c));
  c->rms_eps = 1e-6f;
  KVS_RETURN_IF_ERROR(meta.Positive("attention.layer_norm_rms_epsilon", &c->rms_eps));
  RopeSpec global;
  global.neox = true;
  KVS_RETURN_IF_ERROR(ReadRope(meta, *c, &global));
  RopeSpec local = global;
  local.freq_base = 10000.f;
  local.freq_scale = 1.f;
  KVS_RETURN_IF_ERROR(meta.Positive("rope.freq_base_swa", &local.freq_base));
  LayerSpec layer;
  layer.qk_norm = true;
  layer.norms = NormPlacement::kPreAndPost;
  layer.feed_forward = FeedForwardKind::kGeGluTanh;
  c->layers.assign(static_cast<size_t>(c->n_layer), layer);
  KVS_RETURN_IF_ERROR(ReadSlidingWindows(meta, /*default_pattern=*/6, c));
  // The RoPEs the layers use, once each: a model whose layers share one has one (what a
  // model-wide key calibration needs).
  c->ropes.clear();
  for (LayerSpec& l : c->layers) {
    const RopeSpec& r = l.attention == AttentionKind::kSliding ? local : global;
    const auto it = std::find(c->ropes.begin(), c->ropes.end(), r);
    l.rope = static_cast<int32_t>(it - c->ropes.begin());
    if (it == c->ropes.end()) c->ropes.push_back(r);
  }
  c->embedding_scale = std::sqrt(static_cast<float>(c->n_embd));
  // Queries are scaled by query_pre_attn_scalar^-1/2: the head size, except in the 27B model
  // (62 layers), whose scalar is n_embd / n_head (how llama.cpp tells them apart, too).
  if (c->n_layer == 62) {
    if (c->n_embd < c->n_head) {
      return Status::Error(
          StrFormat("a 62-layer gemma3 scales queries by embedding_length / "
                    "head_count, and %d / %d is 0",
                    c->n_embd, c->n_head));
    }
    c->query_scale = 1.f / std::sqrt(static_cast<float>(c->n_embd / c->n_head));  // as llama.cpp
  }
  KVS_RETURN_IF_ERROR(meta.Positive("final_logit_softcapping", &c->final_logit_softcap));
  return Status::Ok();
}

}  // namespace kvs
