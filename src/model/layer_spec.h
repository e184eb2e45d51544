// What one layer of a model computes, as data: an architecture file (model/arch/) reads GGUF
// metadata into one LayerSpec per layer, and the forward pass runs each layer by its spec. A
// model whose layers differ (sliding-window and global attention, dense and expert feed-forward)
// is a list of different specs, not a branch on the architecture's name.
#pragma once

#include <cstdint>

namespace kvs {

// How a layer's queries and keys are turned (kernels/ops.h RopeParams, without the weights'
// frequency factors, which the model adds: Model::Rope).
struct RopeSpec {
  int32_t n_rot = 0;          // dimensions turned, even, at most head_dim_k
  float freq_base = 10000.f;  // rope.freq_base
  float freq_scale = 1.f;     // 1 / linear scaling factor
  bool neox = false;          // rotate halves (qwen2/qwen3) or adjacent pairs (llama)
  bool freq_factors = false;  // the weights' rope_freqs tensor divides the frequencies

  bool operator==(const RopeSpec&) const = default;
};

enum class AttentionKind {
  kGlobal,   // every earlier key
  kSliding,  // the last LayerSpec::window positions, itself included (local attention)
};

enum class NormPlacement {
  kPre,         // RMS norm of each sublayer's input (attn_norm, ffn_norm); the residual added after
  kPreAndPost,  // and of its output before the residual add (attn_post_norm, ffn_post_norm: Gemma)
};

enum class FeedForwardKind {
  kSwiGlu,     // w_down(silu(w_gate x) * w_up x)
  kGeGluTanh,  // w_down(gelu_tanh(w_gate x) * w_up x) (Gemma)
};

struct LayerSpec {
  AttentionKind attention = AttentionKind::kGlobal;
  int32_t window = 0;    // kSliding: the positions a query sees, itself included (else 0)
  int32_t kv_group = 0;  // index into ModelConfig::kv_groups: the layers whose attention is
                         // alike share one block table per sequence (kv/kv_group.h)
  int32_t kv_slab = 0;   // the layer's place in its group: where an engine's shared KV memory
                         // keeps its blocks (ModelConfig::kv_slabs, kv/kv_storage.h)
  int32_t rope = 0;      // index into ModelConfig::ropes
  bool qk_norm = false;  // per-head RMS norm of Q and K before RoPE (qwen3, gemma3)
  NormPlacement norms = NormPlacement::kPre;
  FeedForwardKind feed_forward = FeedForwardKind::kSwiGlu;

  bool operator==(const LayerSpec&) const = default;
};

}  // namespace kvs
