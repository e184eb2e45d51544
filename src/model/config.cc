#include "model/config.h"

namespace kvs {
namespace {

constexpr int64_t kMaxDim = 1 << 20;  // far beyond any real model; stops absurd metadata

Status ReadDim(const gguf::File& f, const std::string& key, bool required, int32_t* out) {
  const gguf::Value* v = f.Find(key);
  if (!v) {
    if (required) return Status::Error(StrFormat("missing metadata key '%s'", key.c_str()));
    return Status::Ok();
  }
  auto u = v->AsUint();
  if (!u)
    return Status::Error(StrFormat("metadata key '%s' is not an unsigned integer", key.c_str()));
  if (*u == 0 || *u > static_cast<uint64_t>(kMaxDim)) {
    return Status::Error(StrFormat("metadata key '%s' has an absurd value %llu", key.c_str(),
                                   static_cast<unsigned long long>(*u)));
  }
  *out = static_cast<int32_t>(*u);
  return Status::Ok();
}

Status ReadFloat(const gguf::File& f, const std::string& key, float* out) {
  const gguf::Value* v = f.Find(key);
  if (!v) return Status::Ok();
  auto x = v->AsFloat();
  if (!x || !(*x > 0) || *x > 1e12) {
    return Status::Error(StrFormat("metadata key '%s' must be a positive number", key.c_str()));
  }
  *out = static_cast<float>(*x);
  return Status::Ok();
}

}  // namespace

Expected<ModelConfig> ReadModelConfig(const gguf::File& f) {
  ModelConfig c;
  auto arch = f.GetString("general.architecture");
  if (!arch) return Status::Error("missing metadata key 'general.architecture'");
  c.arch_name = *arch;
  if (*arch == "llama") {
    c.arch = Arch::kLlama;
  } else if (*arch == "qwen2") {
    c.arch = Arch::kQwen2;
    c.rope_neox = true;
  } else if (*arch == "qwen3") {
    c.arch = Arch::kQwen3;
    c.rope_neox = true;
  } else {
    return Status::Error(StrFormat(
        "unsupported architecture '%s' (kvserve runs llama, qwen2, qwen3)", arch->c_str()));
  }
  c.name = f.GetString("general.name").value_or(c.arch_name);
  const std::string p = c.arch_name + ".";
  KVS_RETURN_IF_ERROR(ReadDim(f, p + "embedding_length", true, &c.n_embd));
  KVS_RETURN_IF_ERROR(ReadDim(f, p + "block_count", true, &c.n_layer));
  KVS_RETURN_IF_ERROR(ReadDim(f, p + "feed_forward_length", true, &c.n_ff));
  KVS_RETURN_IF_ERROR(ReadDim(f, p + "attention.head_count", true, &c.n_head));
  c.n_head_kv = c.n_head;
  KVS_RETURN_IF_ERROR(ReadDim(f, p + "attention.head_count_kv", false, &c.n_head_kv));
  if (c.n_embd % c.n_head != 0 && !f.Find(p + "attention.key_length")) {
    return Status::Error(
        "embedding_length is not a multiple of head_count and key_length is absent");
  }
  c.head_dim_k = c.n_embd / c.n_head;
  KVS_RETURN_IF_ERROR(ReadDim(f, p + "attention.key_length", false, &c.head_dim_k));
  c.head_dim_v = c.head_dim_k;
  KVS_RETURN_IF_ERROR(ReadDim(f, p + "attention.value_length", false, &c.head_dim_v));
  c.n_rot = c.head_dim_k;
  KVS_RETURN_IF_ERROR(ReadDim(f, p + "rope.dimension_count", false, &c.n_rot));
  c.n_ctx_train = 2048;
  KVS_RETURN_IF_ERROR(ReadDim(f, p + "context_length", false, &c.n_ctx_train));
  KVS_RETURN_IF_ERROR(ReadFloat(f, p + "rope.freq_base", &c.rope_freq_base));
  KVS_RETURN_IF_ERROR(ReadFloat(f, p + "attention.layer_norm_rms_epsilon", &c.rms_eps));
  float scale_factor = 1.f;
  auto scaling = f.GetString(p + "rope.scaling.type");
  if (scaling && *scaling == "linear") {
    KVS_RETURN_IF_ERROR(ReadFloat(f, p + "rope.scaling.factor", &scale_factor));
    c.rope_freq_scale = 1.f / scale_factor;
  } else if (scaling && *scaling != "none") {
    return Status::Error(StrFormat("unsupported rope scaling type '%s'", scaling->c_str()));
  }

  if (c.n_head % c.n_head_kv != 0) {
    return Status::Error(
        StrFormat("head_count %d is not a multiple of head_count_kv %d", c.n_head, c.n_head_kv));
  }
  if (c.n_rot > c.head_dim_k || c.n_rot % 2 != 0) {
    return Status::Error(
        StrFormat("rope.dimension_count %d must be even and at most the head size %d", c.n_rot,
                  c.head_dim_k));
  }
  if (c.n_layer > 4096) return Status::Error(StrFormat("block_count %d is absurd", c.n_layer));
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
