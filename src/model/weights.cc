#include "model/weights.h"

#include <algorithm>
#include <chrono>

#include "core/check.h"
#include "kernels/repack.h"
#include "model/check_tensors.h"
#include "model/weights_digest.h"
#include "tensor/quantize.h"

namespace kvs {
namespace {

std::string ShapeString(const std::vector<uint64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

// Looks the model's tensors up by name, checks their shapes and types, and remembers which
// ones were taken, so that tensors the model never reads can be refused (FirstUnused).
class TensorLoader {
 public:
  explicit TensorLoader(gguf::File& f) : f_(f), used_(f.tensors().size(), false) {}

  Expected<const gguf::TensorInfo*> Find(const std::string& name, std::vector<uint64_t> dims,
                                         bool required = true) {
    const gguf::TensorInfo* t = f_.FindTensor(name);
    if (!t) {
      if (!required) return static_cast<const gguf::TensorInfo*>(nullptr);
      return Status::Error(StrFormat("missing tensor '%s'", name.c_str()));
    }
    used_[t - f_.tensors().data()] = true;
    if (t->dims != dims) {
      return Status::Error(StrFormat("tensor '%s' has shape %s, expected %s", name.c_str(),
                                     ShapeString(t->dims).c_str(), ShapeString(dims).c_str()));
    }
    auto info = GetDTypeInfo(static_cast<uint32_t>(t->type));
    if (!info->supported) {
      return Status::Error(StrFormat("tensor '%s' has type %s, which kvserve cannot compute yet",
                                     name.c_str(), std::string(info->name).c_str()));
    }
    return t;
  }

  // The first tensor in file order that no Find took, or null. llama.cpp refuses such files
  // too ("wrong number of tensors"): a tensor nobody reads means the metadata describes a
  // different model than the weights (a lowered block_count drops whole layers silently).
  const gguf::TensorInfo* FirstUnused() const {
    for (size_t k = 0; k < used_.size(); ++k) {
      if (!used_[k]) return &f_.tensors()[k];
    }
    return nullptr;
  }
  size_t n_used() const { return std::count(used_.begin(), used_.end(), true); }

  // A [rows][cols] matrix (GGUF dims {cols, rows}).
  Status Matrix(const std::string& name, int64_t rows, int64_t cols, MatrixView* out,
                bool required = true) {
    KVS_ASSIGN_OR_RETURN(
        const gguf::TensorInfo* t,
        Find(name, {static_cast<uint64_t>(cols), static_cast<uint64_t>(rows)}, required));
    if (!t) return Status::Ok();
    out->type = t->type;
    out->data = t->data;
    out->rows = rows;
    out->cols = cols;
    out->row_bytes = RowBytes(t->type, cols);
    out->layout = WeightLayout::kRows;
    // Matrices whose type has an interleaved kernel are repacked for it when the bytes are
    // ours to rewrite; a read-only mapping keeps the file's layout and the row-major kernels.
    if (uint8_t* writable = f_.MutableTensorData(*t); writable && CanInterleave(*out)) {
      InterleaveRows(out, writable);
    }
    return Status::Ok();
  }

  Status Vector(const std::string& name, int64_t n, std::vector<float>* out, bool required = true) {
    KVS_ASSIGN_OR_RETURN(const gguf::TensorInfo* t,
                         Find(name, {static_cast<uint64_t>(n)}, required));
    if (!t) return Status::Ok();
    out->resize(n);
    DequantizeRow(t->type, t->data, out->data(), n);
    return Status::Ok();
  }

 private:
  gguf::File& f_;
  std::vector<bool> used_;  // by index in f_.tensors()
};

}  // namespace

Expected<std::unique_ptr<Model>> Model::Load(const std::string& path,
                                             const ModelLoadOptions& options) {
  KVS_ASSIGN_OR_RETURN(auto file, gguf::File::Open(path, options.mode));
  auto model = FromFile(std::move(file), options);
  if (!model.ok() && model.error().find(path) == std::string::npos) {
    return Status::Error(path + ": " + model.error());
  }
  return model;
}

Expected<std::unique_ptr<Model>> Model::FromFile(std::unique_ptr<gguf::File> file,
                                                 const ModelLoadOptions& options) {
  std::unique_ptr<Model> m(new Model());
  m->file_ = std::move(file);
  KVS_ASSIGN_OR_RETURN(m->config_, ReadModelConfig(*m->file_));
  {  // before loading repacks matrices in place
    const auto t0 = std::chrono::steady_clock::now();
    m->weights_digest_ = DigestFileBytes(m->file_->bytes(), m->file_->size());
    m->weights_digest_seconds_ =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  // Before the weights load: loading repacks matrices in place, and the check reports
  // indices in the file's layout.
  if (options.check_tensors) KVS_RETURN_IF_ERROR(CheckTensorValues(*m->file_));
  const ModelConfig& c = m->config_;
  ModelWeights& w = m->weights_;
  TensorLoader load(*m->file_);
  KVS_RETURN_IF_ERROR(load.Matrix("token_embd.weight", c.n_vocab, c.n_embd, &w.token_embd));
  KVS_RETURN_IF_ERROR(load.Vector("output_norm.weight", c.n_embd, &w.output_norm));
  w.output = w.token_embd;  // tied unless the file has its own output matrix
  KVS_RETURN_IF_ERROR(
      load.Matrix("output.weight", c.n_vocab, c.n_embd, &w.output, /*required=*/false));
  for (const RopeSpec& rope : c.ropes) {
    if (rope.freq_factors && w.rope_freqs.empty()) {
      KVS_RETURN_IF_ERROR(load.Vector("rope_freqs.weight", rope.n_rot / 2, &w.rope_freqs));
    }
  }
  w.layers.resize(c.n_layer);
  for (int32_t l = 0; l < c.n_layer; ++l) {
    LayerWeights& L = w.layers[l];
    const std::string p = "blk." + std::to_string(l) + ".";
    KVS_RETURN_IF_ERROR(load.Vector(p + "attn_norm.weight", c.n_embd, &L.attn_norm));
    KVS_RETURN_IF_ERROR(load.Matrix(p + "attn_q.weight", c.q_dim(), c.n_embd, &L.wq));
    KVS_RETURN_IF_ERROR(load.Matrix(p + "attn_k.weight", c.k_dim(), c.n_embd, &L.wk));
    KVS_RETURN_IF_ERROR(load.Matrix(p + "attn_v.weight", c.v_dim(), c.n_embd, &L.wv));
    KVS_RETURN_IF_ERROR(
        load.Matrix(p + "attn_output.weight", c.n_embd, c.n_head * c.head_dim_v, &L.wo));
    // Biases are optional for every architecture (qwen2 has them); qwen3 requires q/k norms.
    KVS_RETURN_IF_ERROR(load.Vector(p + "attn_q.bias", c.q_dim(), &L.bq, false));
    KVS_RETURN_IF_ERROR(load.Vector(p + "attn_k.bias", c.k_dim(), &L.bk, false));
    KVS_RETURN_IF_ERROR(load.Vector(p + "attn_v.bias", c.v_dim(), &L.bv, false));
    // Only where the layer's spec runs them: stray norms stay unused and refuse the file.
    if (c.layers[l].qk_norm) {
      KVS_RETURN_IF_ERROR(load.Vector(p + "attn_q_norm.weight", c.head_dim_k, &L.q_norm));
      KVS_RETURN_IF_ERROR(load.Vector(p + "attn_k_norm.weight", c.head_dim_k, &L.k_norm));
    }
    KVS_RETURN_IF_ERROR(load.Vector(p + "ffn_norm.weight", c.n_embd, &L.ffn_norm));
    KVS_RETURN_IF_ERROR(load.Matrix(p + "ffn_gate.weight", c.n_ff, c.n_embd, &L.w_gate));
    KVS_RETURN_IF_ERROR(load.Matrix(p + "ffn_up.weight", c.n_ff, c.n_embd, &L.w_up));
    KVS_RETURN_IF_ERROR(load.Matrix(p + "ffn_down.weight", c.n_embd, c.n_ff, &L.w_down));
    if (c.layers[l].norms == NormPlacement::kPreAndPost) {
      KVS_RETURN_IF_ERROR(
          load.Vector(p + "post_attention_norm.weight", c.n_embd, &L.attn_post_norm));
      KVS_RETURN_IF_ERROR(load.Vector(p + "post_ffw_norm.weight", c.n_embd, &L.ffn_post_norm));
    }
  }
  if (const gguf::TensorInfo* unused = load.FirstUnused()) {
    return Status::Error(
        StrFormat("tensor '%s' is not used by the model: the file has %zu tensors, a %s with "
                  "%s.block_count = %d uses %zu (the metadata and the tensors disagree)",
                  unused->name.c_str(), m->file_->tensors().size(), c.arch_name.c_str(),
                  c.arch_name.c_str(), c.n_layer, load.n_used()));
  }
  return m;
}

const gguf::File& Model::file() const {
  KVS_CHECK_MSG(file_ != nullptr, "a compressed view has no file: use its base model's");
  return *file_;
}

RopeParams Model::Rope(int32_t i) const {
  const RopeSpec& r = config_.ropes[i];
  const bool factors = r.freq_factors && !weights_.rope_freqs.empty();
  return RopeParams{r.n_rot, r.freq_base, r.freq_scale, r.neox,
                    factors ? weights_.rope_freqs.data() : nullptr};
}

size_t Model::owned_bytes() const {
  size_t bytes = 0;
  for (const PageMemory& m : owned_) bytes += m.size();
  return bytes;
}

size_t Model::WeightBytesPerToken() const {
  size_t bytes = weights_.token_embd.row_bytes + weights_.output.row_bytes * weights_.output.rows;
  for (const LayerWeights& L : weights_.layers) {
    for (const MatrixView* mv : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) {
      bytes += mv->row_bytes * mv->rows;
    }
  }
  return bytes;
}

}  // namespace kvs
