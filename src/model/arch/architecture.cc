#include "model/arch/architecture.h"

#include <tuple>

namespace kvs {
namespace {

constexpr int64_t kMaxDim = 1 << 20;  // far beyond any real model; stops absurd metadata

constexpr Architecture kArchitectures[] = {
    {"llama", ReadLlamaFamily},  // Llama 1-3 and Mistral (their GGUFs say "llama")
    {"qwen2", ReadQwen2},
    {"qwen3", ReadQwen3},
    {"gemma3", ReadGemma3},
};

}  // namespace

std::span<const Architecture> Architectures() {
  return kArchitectures;
}

Status MetadataReader::Dim(const std::string& key, bool required, int32_t* out) const {
  const gguf::Value* v = f_.Find(prefix_ + key);
  if (!v) {
    if (required) {
      return Status::Error(StrFormat("missing metadata key '%s%s'", prefix_.c_str(), key.c_str()));
    }
    return Status::Ok();
  }
  auto u = v->AsUint();
  if (!u) {
    return Status::Error(
        StrFormat("metadata key '%s%s' is not an unsigned integer", prefix_.c_str(), key.c_str()));
  }
  if (*u == 0 || *u > static_cast<uint64_t>(kMaxDim)) {
    return Status::Error(StrFormat("metadata key '%s%s' has an absurd value %llu", prefix_.c_str(),
                                   key.c_str(), static_cast<unsigned long long>(*u)));
  }
  *out = static_cast<int32_t>(*u);
  return Status::Ok();
}

Status MetadataReader::Positive(const std::string& key, float* out) const {
  const gguf::Value* v = f_.Find(prefix_ + key);
  if (!v) return Status::Ok();
  auto x = v->AsFloat();
  if (!x || !(*x > 0) || *x > 1e12) {
    return Status::Error(
        StrFormat("metadata key '%s%s' must be a positive number", prefix_.c_str(), key.c_str()));
  }
  *out = static_cast<float>(*x);
  return Status::Ok();
}

std::optional<std::string> MetadataReader::String(const std::string& key) const {
  return f_.GetString(prefix_ + key);
}

Status ReadTransformerDims(const MetadataReader& meta, ModelConfig* c) {
  KVS_RETURN_IF_ERROR(meta.Dim("embedding_length", true, &c->n_embd));
  KVS_RETURN_IF_ERROR(meta.Dim("block_count", true, &c->n_layer));
  KVS_RETURN_IF_ERROR(meta.Dim("feed_forward_length", true, &c->n_ff));
  KVS_RETURN_IF_ERROR(meta.Dim("attention.head_count", true, &c->n_head));
  c->n_head_kv = c->n_head;
  KVS_RETURN_IF_ERROR(meta.Dim("attention.head_count_kv", false, &c->n_head_kv));
  if (c->n_embd % c->n_head != 0 && !meta.Has("attention.key_length")) {
    return Status::Error(
        "embedding_length is not a multiple of head_count and key_length is absent");
  }
  c->head_dim_k = c->n_embd / c->n_head;
  KVS_RETURN_IF_ERROR(meta.Dim("attention.key_length", false, &c->head_dim_k));
  c->head_dim_v = c->head_dim_k;
  KVS_RETURN_IF_ERROR(meta.Dim("attention.value_length", false, &c->head_dim_v));
  // Products of dimensions stay far inside int32 (q_dim, k_dim, and the buffers sized by them).
  for (const auto& [what, heads, dim] :
       {std::tuple{"head_count x key_length", c->n_head, c->head_dim_k},
        std::tuple{"head_count x value_length", c->n_head, c->head_dim_v}}) {
    if (int64_t{heads} * dim > kMaxDim) {
      return Status::Error(
          StrFormat("%s = %lld is absurd", what, static_cast<long long>(int64_t{heads} * dim)));
    }
  }
  c->n_ctx_train = 2048;
  KVS_RETURN_IF_ERROR(meta.Dim("context_length", false, &c->n_ctx_train));
  KVS_RETURN_IF_ERROR(meta.Positive("attention.layer_norm_rms_epsilon", &c->rms_eps));
  return Status::Ok();
}

Status ReadRope(const MetadataReader& meta, const ModelConfig& c, RopeSpec* rope) {
  rope->n_rot = c.head_dim_k;
  KVS_RETURN_IF_ERROR(meta.Dim("rope.dimension_count", false, &rope->n_rot));
  KVS_RETURN_IF_ERROR(meta.Positive("rope.freq_base", &rope->freq_base));
  // As llama.cpp reads them: the type defaults to linear, and the factor (rope.scaling.factor,
  // else the older rope.scale_linear) divides the frequencies whatever the type says.
  if (meta.Has("rope.scaling.type") && !meta.String("rope.scaling.type")) {
    return Status::Error(
        StrFormat("metadata key '%s' is not a string", meta.Key("rope.scaling.type").c_str()));
  }
  const std::string scaling = meta.String("rope.scaling.type").value_or("linear");
  if (scaling != "linear" && scaling != "none") {
    return Status::Error(StrFormat("unsupported rope scaling type '%s'", scaling.c_str()));
  }
  float factor = 1.f;
  KVS_RETURN_IF_ERROR(meta.Positive(
      meta.Has("rope.scaling.factor") ? "rope.scaling.factor" : "rope.scale_linear", &factor));
  rope->freq_scale = 1.f / factor;
  if (rope->n_rot > c.head_dim_k || rope->n_rot % 2 != 0) {
    return Status::Error(
        StrFormat("rope.dimension_count %d must be even and at most the head size %d", rope->n_rot,
                  c.head_dim_k));
  }
  // The weights' rope_freqs tensor, where the file has one (llama 3.1), divides every layer's
  // frequencies.
  rope->freq_factors = meta.file().FindTensor("rope_freqs.weight") != nullptr;
  return Status::Ok();
}

Status ReadSlidingWindows(const MetadataReader& meta, int32_t default_pattern, ModelConfig* c) {
  int32_t window = 0;
  KVS_RETURN_IF_ERROR(meta.Dim("attention.sliding_window", false, &window));
  if (window == 0) return Status::Ok();
  const std::string key = meta.Key("attention.sliding_window_pattern");
  std::vector<bool> sliding(static_cast<size_t>(c->n_layer));
  const gguf::Value* pattern = meta.file().Find(key);
  if (pattern != nullptr && pattern->type == gguf::ValueType::kArray) {
    // One flag per layer (llama.cpp's per-layer form): true where the layer is local.
    if (!gguf::IsIntegerType(pattern->array_type)) {
      return Status::Error(
          StrFormat("metadata key '%s' is an array of %s, not of booleans", key.c_str(),
                    std::string(gguf::ValueTypeName(pattern->array_type)).c_str()));
    }
    if (pattern->ints.size() != sliding.size()) {
      return Status::Error(StrFormat("metadata key '%s' has %zu entries, not one per layer (%d)",
                                     key.c_str(), pattern->ints.size(), c->n_layer));
    }
    for (size_t l = 0; l < sliding.size(); ++l) sliding[l] = pattern->ints[l] != 0;
  } else {
    // Every n-th layer global, the others local (n = 0: all local).
    int64_t n = default_pattern;
    if (pattern != nullptr) {
      const std::optional<uint64_t> v = meta.file().GetUint(key);
      if (!v || *v > 4096) {
        return Status::Error(StrFormat("metadata key '%s' is not a layer count", key.c_str()));
      }
      n = static_cast<int64_t>(*v);
    }
    for (size_t l = 0; l < sliding.size(); ++l) {
      sliding[l] = n == 0 || static_cast<int64_t>(l) % n < n - 1;
    }
  }
  for (size_t l = 0; l < sliding.size(); ++l) {
    if (!sliding[l]) continue;
    c->layers[l].attention = AttentionKind::kSliding;
    c->layers[l].window = window;
  }
  return Status::Ok();
}

}  // namespace kvs
