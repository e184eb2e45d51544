#include "model/config.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "model/arch/architecture.h"

namespace kvs {
namespace {

Status CheckLayers(const ModelConfig& c) {
  if (c.n_head % c.n_head_kv != 0) {
    return Status::Error(
        StrFormat("head_count %d is not a multiple of head_count_kv %d", c.n_head, c.n_head_kv));
  }
  if (c.n_layer > 4096) return Status::Error(StrFormat("block_count %d is absurd", c.n_layer));
  if (c.layers.size() != static_cast<size_t>(c.n_layer) || c.ropes.empty()) {
    return Status::Error("the architecture did not describe every layer");
  }
  for (const LayerSpec& l : c.layers) {
    if (l.rope < 0 || l.rope >= static_cast<int32_t>(c.ropes.size())) {
      return Status::Error("a layer names a RoPE the architecture did not describe");
    }
  }
  return Status::Ok();
}

}  // namespace

float ModelConfig::attention_scale() const {
  return query_scale > 0 ? query_scale : 1.f / std::sqrt(static_cast<float>(head_dim_k));
}

int32_t ModelConfig::kv_slabs() const {
  int32_t slabs = 0;
  for (const LayerSpec& l : layers) slabs = std::max(slabs, l.kv_slab + 1);
  return slabs;
}

Status AssignKvGroups(ModelConfig* c) {
  // The layers of each kind of attention (0: global, else the window), kinds in group order.
  std::map<int32_t, std::vector<int32_t>> kinds;
  for (size_t l = 0; l < c->layers.size(); ++l) {
    const LayerSpec& spec = c->layers[l];
    const bool sliding = spec.attention == AttentionKind::kSliding;
    if (sliding && spec.window <= 0) return Status::Error("a sliding-window layer has no window");
    kinds[sliding ? spec.window : 0].push_back(static_cast<int32_t>(l));
  }
  // Every group gets the same number of layers (vLLM's uniform page size): the smallest kind's
  // count, or the largest's where that pads little (under a quarter more).
  size_t smallest = c->layers.size(), largest = 0;
  for (const auto& [window, layers] : kinds) {
    smallest = std::min(smallest, layers.size());
    largest = std::max(largest, layers.size());
  }
  const size_t per_group = largest * 4 < smallest * 5 ? largest : std::max<size_t>(smallest, 1);
  c->kv_groups.clear();
  for (const auto& [window, layers] : kinds) {
    for (size_t i = 0; i < layers.size(); ++i) {
      if (i % per_group == 0) c->kv_groups.push_back(KvGroupSpec{window});
      LayerSpec& spec = c->layers[layers[i]];
      spec.kv_group = static_cast<int32_t>(c->kv_groups.size()) - 1;
      spec.kv_slab = static_cast<int32_t>(i % per_group);
    }
  }
  return Status::Ok();
}

Expected<ModelConfig> ReadModelConfig(const gguf::File& f) {
  ModelConfig c;
  auto arch = f.GetString("general.architecture");
  if (!arch) {
    return Status::Error(f.Find("general.architecture")
                             ? "metadata key 'general.architecture' is not a string"
                             : "missing metadata key 'general.architecture'");
  }
  c.arch_name = *arch;
  const Architecture* found = nullptr;
  std::string names;
  for (const Architecture& a : Architectures()) {
    if (a.name == c.arch_name) found = &a;
    names += names.empty() ? a.name : std::string(", ") + a.name;
  }
  if (!found) {
    return Status::Error(
        StrFormat("unsupported architecture '%s' (kvserve runs %s)", arch->c_str(), names.c_str()));
  }
  c.name = f.GetString("general.name").value_or(c.arch_name);
  KVS_RETURN_IF_ERROR(found->read(MetadataReader(f, c.arch_name), &c));
  KVS_RETURN_IF_ERROR(CheckLayers(c));
  KVS_RETURN_IF_ERROR(AssignKvGroups(&c));
  // The vocabulary size comes from the embedding tensor (checked again by the weights).
  const gguf::TensorInfo* emb = f.FindTensor("token_embd.weight");
  if (!emb) return Status::Error("missing tensor 'token_embd.weight'");
  if (emb->dims.size() != 2) return Status::Error("tensor 'token_embd.weight' must be 2-D");
  if (emb->dims[1] > (1u << 24))
    return Status::Error("tensor 'token_embd.weight' has an absurd vocabulary size");
  c.n_vocab = static_cast<int32_t>(emb->dims[1]);
  return c;
}

}  // namespace kvs
