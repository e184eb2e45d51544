// Hyperparameters read from GGUF metadata ({arch}.* keys) by the model's architecture file
// (model/arch/), validated before any allocation: what every layer shares, and one LayerSpec
// per layer for what may differ between them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "gguf/gguf_reader.h"
#include "kv/kv_group.h"
#include "model/layer_spec.h"

namespace kvs {

struct ModelConfig {
  std::string arch_name;  // general.architecture
  std::string name;       // general.name
  int32_t n_embd = 0;
  int32_t n_layer = 0;
  int32_t n_head = 0;
  int32_t n_head_kv = 0;
  int32_t head_dim_k = 0;  // attention.key_length (defaults to n_embd / n_head)
  int32_t head_dim_v = 0;  // attention.value_length
  int32_t n_ff = 0;
  int32_t n_vocab = 0;
  int32_t n_ctx_train = 0;
  float rms_eps = 1e-5f;
  float embedding_scale = 1.f;      // multiplies each token's embedding row (gemma: sqrt(n_embd))
  float query_scale = 0.f;          // the attention's score scale; 0: 1 / sqrt(head_dim_k)
  float final_logit_softcap = 0.f;  // > 0: logits = cap * tanh(logits / cap)
  std::vector<RopeSpec> ropes;      // the distinct RoPEs of the layers (today's models: one)
  std::vector<LayerSpec> layers;    // [n_layer]
  // The KV cache groups (kv/kv_group.h), global first, then sliding windows from the narrowest;
  // each layer's kv_group indexes this. Set by ReadModelConfig (AssignKvGroups) from the layers'
  // attention: one group per kind of attention, or, where the kinds have different numbers of
  // layers, each kind cut into groups of (about) the smallest kind's count, as vLLM's hybrid KV
  // cache manager does, so that every group has kv_slabs() layers (the last of a kind fewer).
  std::vector<KvGroupSpec> kv_groups;

  int32_t q_dim() const { return n_head * head_dim_k; }
  int32_t k_dim() const { return n_head_kv * head_dim_k; }
  int32_t v_dim() const { return n_head_kv * head_dim_v; }
  float attention_scale() const;
  // The layers of the largest KV group: an engine's KV memory keeps this many layers per block,
  // each group's layers sharing the slabs (a block belongs to one group at a time). n_layer for
  // a model of one group.
  int32_t kv_slabs() const;
  const RopeSpec& rope_of(int32_t layer) const { return ropes[layers[layer].rope]; }
  // The RoPE of every layer where all layers share one; null where they differ. What is
  // calibrated for the model as a whole (key offsets, tri's query centres) needs one.
  const RopeSpec* uniform_rope() const { return ropes.size() == 1 ? &ropes[0] : nullptr; }
};

// Sets c->kv_groups and each layer's kv_group and kv_slab from the layers' attention; an error
// for a sliding layer without a window.
Status AssignKvGroups(ModelConfig* c);

// Reads the config through the architecture file named by general.architecture.
Expected<ModelConfig> ReadModelConfig(const gguf::File& file);

}  // namespace kvs
