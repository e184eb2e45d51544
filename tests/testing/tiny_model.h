// Tiny random-weight GGUF models of each supported architecture, written with our own
// gguf::Writer, for tests that need a model but not a trained one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gguf/gguf_writer.h"
#include "tensor/dtype.h"

namespace kvs::testing {

struct TinyModelSpec {
  std::string arch = "llama";  // llama, qwen2, qwen3, gemma3
  int32_t n_embd = 64;
  int32_t n_layer = 2;
  int32_t n_head = 4;
  int32_t n_head_kv = 2;
  int32_t head_dim = 16;  // qwen3 may differ from n_embd / n_head
  int32_t n_ff = 96;
  int32_t n_ctx = 256;
  DType weight_type = DType::kF32;
  bool tied_output = false;
  uint64_t seed = 1;
};

// A writer holding the model's metadata, a small SentencePiece vocabulary with byte fallback
// (259 + 32 tokens) and random weights. Tests may edit it before serializing.
gguf::Writer MakeTinyModelWriter(const TinyModelSpec& spec);
std::vector<uint8_t> MakeTinyModel(const TinyModelSpec& spec);
// Writes the model to a temporary file and returns its path.
std::string WriteTinyModel(const TinyModelSpec& spec, const std::string& name);

constexpr int32_t kTinyVocab = 259 + 32;

}  // namespace kvs::testing
