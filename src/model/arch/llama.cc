// The dense Llama family: llama (Llama 1-3, Mistral), qwen2 (biases on Q/K/V, NeoX RoPE) and
// qwen3 (per-head Q/K norms, NeoX RoPE). Every layer alike: global attention, pre-norms, SwiGLU.
#include "model/arch/architecture.h"

#include <string>

namespace kvs {
namespace {

Status ReadDenseLlama(const MetadataReader& meta, bool neox, bool qk_norm, ModelConfig* c) {
  KVS_RETURN_IF_ERROR(ReadTransformerDims(meta, c));
  RopeSpec rope;
  rope.neox = neox;
  KVS_RETURN_IF_ERROR(ReadRope(meta, *c, &rope));
  c->ropes = {rope};
  // Per-head Q/K norms: qwen3 in every layer; another family's file in each layer that has
  // either tensor (the weights then require both, and refuse norms a layer does not run).
  c->layers.assign(static_cast<size_t>(c->n_layer), LayerSpec{});
  for (int32_t l = 0; l < c->n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    c->layers[l].qk_norm = qk_norm || meta.file().FindTensor(p + "attn_q_norm.weight") ||
                           meta.file().FindTensor(p + "attn_k_norm.weight");
  }
  // llama.cpp runs these families with global attention whatever a file says of windows (a
  // Mistral v0.1 conversion may carry attention.sliding_window): so does kvserve, unless the
  // file also names which layers are local (attention.sliding_window_pattern), as files
  // written to exercise local attention do.
  if (meta.Has("attention.sliding_window_pattern")) {
    KVS_RETURN_IF_ERROR(ReadSlidingWindows(meta, /*default_pattern=*/0, c));
  }
  return Status::Ok();
}

}  // namespace

Status ReadLlamaFamily(const MetadataReader& meta, ModelConfig* c) {
  return ReadDenseLlama(meta, /*neox=*/false, /*qk_norm=*/false, c);
}

Status ReadQwen2(const MetadataReader& meta, ModelConfig* c) {
  return ReadDenseLlama(meta, /*neox=*/true, /*qk_norm=*/false, c);
}

Status ReadQwen3(const MetadataReader& meta, ModelConfig* c) {
  return ReadDenseLlama(meta, /*neox=*/true, /*qk_norm=*/true, c);
}

}  // namespace kvs
