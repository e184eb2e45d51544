#include "model/config.h"

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
