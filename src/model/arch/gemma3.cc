// Gemma 3, as llama.cpp's converter writes it (general.architecture "gemma3"): five local layers
// (a sliding window of attention.sliding_window positions, their own RoPE base
// rope.freq_base_swa, 10,000 by default, never scaled) to every global one (the sixth, unless
// attention.sliding_window_pattern says otherwise; rope.freq_base with the file's linear
// scaling); per-head RMS norms of Q and K; RMS norms before and after each sublayer; GeGLU with
// the tanh GELU; the embedding scaled by sqrt(n_embd); the output tied to the embedding unless
// the file has one. The norms' weights are stored as 1 + w (the converter adds the one), so they
// are plain RMS norms here.
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
  c->ropes = {global, local};
  LayerSpec layer;
  layer.qk_norm = true;
  layer.norms = NormPlacement::kPreAndPost;
  layer.feed_forward = FeedForwardKind::kGeGluTanh;
  c->layers.assign(static_cast<size_t>(c->n_layer), layer);
  KVS_RETURN_IF_ERROR(ReadSlidingWindows(meta, /*default_pattern=*/6, c));
  for (LayerSpec& l : c->layers) l.rope = l.attention == AttentionKind::kSliding ? 1 : 0;
  if (c->ropes[1] == c->ropes[0]) c->ropes.pop_back();  // one RoPE for every layer
  c->embedding_scale = std::sqrt(static_cast<float>(c->n_embd));
  // Queries are scaled by query_pre_attn_scalar^-1/2: the head size, except in the 27B model
  // (62 layers), whose scalar is n_embd / n_head (how llama.cpp tells them apart, too).
  if (c->n_layer == 62) c->query_scale = 1.f / std::sqrt(static_cast<float>(c->n_embd / c->n_head));
  KVS_RETURN_IF_ERROR(meta.Positive("final_logit_softcapping", &c->final_logit_softcap));
  return Status::Ok();
}

}  // namespace kvs
