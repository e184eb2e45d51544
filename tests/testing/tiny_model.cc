#include "testing/tiny_model.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>

#include "core/check.h"

namespace kvs::testing {
namespace {

std::vector<float> RandomVector(std::mt19937_64& rng, size_t n, float scale, float offset = 0) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = offset + scale * dist(rng);
  return v;
}

// A SentencePiece-style vocabulary: <unk>, <s>, </s>, the 256 byte tokens and a few words.
void AddVocab(gguf::Writer& w) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<float> scores = {0, 0, 0};
  std::vector<int32_t> types = {2, 3, 3};
  char buf[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    tokens.push_back(buf);
    scores.push_back(0);
    types.push_back(6);
  }
  const char* words[] = {"▁",  "e",  "t", "a",  "o",  "n",  "▁t", "he", "▁the", "▁a", "in",
                         "s",  "r",  "h", "l",  "d",  "▁s", "▁w", "er", "an",   "▁b", "ou",
                         "it", "ll", "y", "▁o", "▁h", "▁i", "g",  "m",  "c",    "."};
  for (size_t i = 0; i < std::size(words); ++i) {
    tokens.push_back(words[i]);
    scores.push_back(-static_cast<float>(i));
    types.push_back(1);
  }
  KVS_CHECK(static_cast<int32_t>(tokens.size()) == kTinyVocab);
  w.Set("tokenizer.ggml.model", gguf::Value::String("llama"));
  w.Set("tokenizer.ggml.tokens", gguf::Value::StringArray(tokens));
  w.Set("tokenizer.ggml.scores", gguf::Value::Float32Array(scores));
  w.Set("tokenizer.ggml.token_type", gguf::Value::Int32Array(types));
  w.Set("tokenizer.ggml.bos_token_id", gguf::Value::Uint32(1));
  w.Set("tokenizer.ggml.eos_token_id", gguf::Value::Uint32(2));
  w.Set("tokenizer.ggml.unknown_token_id", gguf::Value::Uint32(0));
}

}  // namespace

gguf::Writer MakeTinyModelWriter(const TinyModelSpec& s) {
  std::mt19937_64 rng(s.seed);
  gguf::Writer w;
  const std::string a = s.arch + ".";
  w.Set("general.architecture", gguf::Value::String(s.arch));
  w.Set("general.name", gguf::Value::String("tiny-" + s.arch));
  w.Set(a + "context_length", gguf::Value::Uint32(s.n_ctx));
  w.Set(a + "embedding_length", gguf::Value::Uint32(s.n_embd));
  w.Set(a + "block_count", gguf::Value::Uint32(s.n_layer));
  w.Set(a + "feed_forward_length", gguf::Value::Uint32(s.n_ff));
  w.Set(a + "attention.head_count", gguf::Value::Uint32(s.n_head));
  w.Set(a + "attention.head_count_kv", gguf::Value::Uint32(s.n_head_kv));
  w.Set(a + "attention.key_length", gguf::Value::Uint32(s.head_dim));
  w.Set(a + "attention.value_length", gguf::Value::Uint32(s.head_dim));
  w.Set(a + "rope.dimension_count", gguf::Value::Uint32(s.head_dim));
  w.Set(a + "rope.freq_base", gguf::Value::Float32(10000.f));
  w.Set(a + "attention.layer_norm_rms_epsilon", gguf::Value::Float32(1e-5f));
  AddVocab(w);

  const uint64_t d = s.n_embd, V = kTinyVocab, qd = s.n_head * s.head_dim,
                 kd = s.n_head_kv * s.head_dim;
  auto matrix = [&](const std::string& name, uint64_t rows, uint64_t cols) {
    w.AddTensorF32(name, {cols, rows}, s.weight_type,
                   RandomVector(rng, rows * cols, 1.f / std::sqrt(float(cols))));
  };
  auto norm = [&](const std::string& name, uint64_t n) {
    w.AddTensorF32(name, {n}, DType::kF32, RandomVector(rng, n, 0.1f, 1.f));
  };
  w.AddTensorF32("token_embd.weight", {d, V}, s.weight_type, RandomVector(rng, V * d, 1.f));
  norm("output_norm.weight", d);
  if (!s.tied_output) matrix("output.weight", V, d);
  for (int32_t l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    norm(p + "attn_norm.weight", d);
    matrix(p + "attn_q.weight", qd, d);
    matrix(p + "attn_k.weight", kd, d);
    matrix(p + "attn_v.weight", kd, d);
    matrix(p + "attn_output.weight", d, qd);
    if (s.arch == "qwen2") {
      w.AddTensorF32(p + "attn_q.bias", {qd}, DType::kF32, RandomVector(rng, qd, 0.1f));
      w.AddTensorF32(p + "attn_k.bias", {kd}, DType::kF32, RandomVector(rng, kd, 0.1f));
      w.AddTensorF32(p + "attn_v.bias", {kd}, DType::kF32, RandomVector(rng, kd, 0.1f));
    }
    if (s.arch == "qwen3" || s.arch == "gemma3") {
      norm(p + "attn_q_norm.weight", s.head_dim);
      norm(p + "attn_k_norm.weight", s.head_dim);
    }
    if (s.arch == "gemma3") {
      norm(p + "post_attention_norm.weight", d);
      norm(p + "post_ffw_norm.weight", d);
    }
    norm(p + "ffn_norm.weight", d);
    matrix(p + "ffn_gate.weight", s.n_ff, d);
    matrix(p + "ffn_up.weight", s.n_ff, d);
    matrix(p + "ffn_down.weight", d, s.n_ff);
  }
  return w;
}

std::vector<uint8_t> MakeTinyModel(const TinyModelSpec& spec) {
  return MakeTinyModelWriter(spec).Serialize();
}

std::string WriteTinyModel(const TinyModelSpec& spec, const std::string& name) {
  std::filesystem::path dir = std::filesystem::temp_directory_path() / "kvserve-test";
  std::filesystem::create_directories(dir);
  std::string path = (dir / (name + ".gguf")).string();
  Status st = MakeTinyModelWriter(spec).WriteFile(path);
  KVS_CHECK(st.ok());
  return path;
}

}  // namespace kvs::testing
