// The model's tensors, as views into the loaded GGUF file (matrices stay in their stored
// type) plus small f32 copies of the vectors (norms, biases), all shape-checked at load.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/digest.h"
#include "core/page_memory.h"
#include "core/status.h"
#include "gguf/gguf_reader.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "model/config.h"

namespace kvs {

struct LayerWeights {
  std::vector<float> attn_norm;       // [n_embd]
  MatrixView wq;                      // [q_dim][n_embd]
  MatrixView wk;                      // [k_dim][n_embd]
  MatrixView wv;                      // [v_dim][n_embd]
  MatrixView wo;                      // [n_embd][n_head * head_dim_v]
  std::vector<float> bq, bk, bv;      // qwen2 biases, empty otherwise
  std::vector<float> q_norm, k_norm;  // qwen3 per-head norms [head_dim_k], empty otherwise
  std::vector<float> attn_post_norm;  // [n_embd] NormPlacement::kPreAndPost, empty otherwise
  std::vector<float> ffn_norm;        // [n_embd]
  MatrixView w_gate;                  // [n_ff][n_embd]
  MatrixView w_up;                    // [n_ff][n_embd]
  MatrixView w_down;                  // [n_embd][n_ff]
  std::vector<float> ffn_post_norm;   // [n_embd] NormPlacement::kPreAndPost, empty otherwise
};

struct ModelWeights {
  MatrixView token_embd;           // [n_vocab][n_embd]
  std::vector<float> output_norm;  // [n_embd]
  MatrixView output;               // [n_vocab][n_embd]; the embedding when tied
  std::vector<float> rope_freqs;   // [n_rot/2] or empty
  std::vector<LayerWeights> layers;
};

struct ModelLoadOptions {
  // Reading into huge-page memory is the default: decode then streams the weights at up to
  // twice the speed of a file mapping's 4 KiB pages (F16 llama-1b: 18.6 vs 9.7-11.8 t/s).
  gguf::LoadMode mode = gguf::LoadMode::kRead;
  // Refuse a model with a NaN or infinity in any weight (CheckTensorValues). Off by default,
  // as in llama.cpp: it reads the whole file once more.
  bool check_tensors = false;
};

struct CompressedViewOptions;

// A loaded model: the mapped file, its config and weight views. Loading refuses a file whose
// tensors the model does not all use (say, block_count lowered below the layers present).
// A compressed view (model/compressed_view.h) is a Model too, but without a file: its matrices
// lie in memory it owns or in its base model's file.
class Model {
 public:
  static Expected<std::unique_ptr<Model>> Load(const std::string& path,
                                               const ModelLoadOptions& options = {});
  // options.mode does not apply (the file is open already).
  static Expected<std::unique_ptr<Model>> FromFile(std::unique_ptr<gguf::File> file,
                                                   const ModelLoadOptions& options = {});

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  // RoPE i of config().ropes as the kernels take it (with the weights' frequency factors where
  // it uses them); RopeOfLayer: the one layer l turns its queries and keys by.
  RopeParams Rope(int32_t i) const;
  RopeParams RopeOfLayer(int32_t l) const { return Rope(config_.layers[l].rope); }
  // The GGUF file (metadata, tokenizer). Only a model loaded from a file has one (has_file());
  // a compressed view has none: take the tokenizer and metadata from its base.
  bool has_file() const { return file_ != nullptr; }
  const gguf::File& file() const;
  // Bytes of weights read for one decode step (every matrix once, one embedding row).
  size_t WeightBytesPerToken() const;
  // Digest of the whole file as it was read, before any repacking (weights_digest.h): two
  // files that differ in any byte differ here, so KV computed with one is never taken for the
  // other's.
  const Digest128& weights_digest() const { return weights_digest_; }
  double weights_digest_seconds() const { return weights_digest_seconds_; }
  // Bytes of weight buffers the model owns besides its file (a compressed view's matrices).
  size_t owned_bytes() const;

 private:
  friend Expected<std::unique_ptr<Model>> MakeCompressedView(const Model& base,
                                                             const CompressedViewOptions& options,
                                                             ThreadPool& pool);

  std::unique_ptr<gguf::File> file_;  // null in a compressed view
  std::vector<PageMemory> owned_;     // buffers the weights point into besides file_
  ModelConfig config_;
  ModelWeights weights_;
  Digest128 weights_digest_;
  double weights_digest_seconds_ = 0;
};

}  // namespace kvs
