// Hyperparameters read from GGUF metadata ({arch}.* keys), validated before any allocation.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "gguf/gguf_reader.h"

namespace kvs {

enum class Arch { kLlama, kQwen2, kQwen3 };

struct ModelConfig {
  Arch arch = Arch::kLlama;
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
  int32_t n_rot = 0;
  float rope_freq_base = 10000.f;
  float rope_freq_scale = 1.f;
  bool rope_neox = false;  // qwen2/qwen3 rotate halves; llama rotates adjacent pairs
  float rms_eps = 1e-5f;

  int32_t q_dim() const { return n_head * head_dim_k; }
  int32_t k_dim() const { return n_head_kv * head_dim_k; }
  int32_t v_dim() const { return n_head_kv * head_dim_v; }
};

Expected<ModelConfig> ReadModelConfig(const gguf::File& file);

}  // namespace kvs
