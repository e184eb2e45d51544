// An architecture is one file in model/arch/ that reads its GGUF metadata into a ModelConfig:
// the shared dimensions and one LayerSpec per layer. Nothing outside model/arch/ asks which
// architecture a model is; it reads the specs. Adding an architecture: a file here with a
// Read function, one line in the table of architecture.cc, and whatever new kind of layer its
// specs name in model/forward.cc and model/weights.cc.
#pragma once

#include <span>
#include <string>

#include "core/status.h"
#include "gguf/gguf_reader.h"
#include "model/config.h"

namespace kvs {

// Typed, range-checked reads of `{arch}.KEY` metadata.
class MetadataReader {
 public:
  MetadataReader(const gguf::File& file, std::string arch) : f_(file), prefix_(arch + ".") {}
  const gguf::File& file() const { return f_; }
  bool Has(const std::string& key) const { return f_.Find(prefix_ + key) != nullptr; }
  // The full key, for messages: "llama.rope.freq_base".
  std::string Key(const std::string& key) const { return prefix_ + key; }
  // A positive integer up to 2^20 (far beyond any real model: stops absurd metadata). Absent
  // and not required: *out stays as it was.
  Status Dim(const std::string& key, bool required, int32_t* out) const;
  // A positive number up to 1e12; absent: *out stays.
  Status Positive(const std::string& key, float* out) const;
  std::optional<std::string> String(const std::string& key) const;

 private:
  const gguf::File& f_;
  std::string prefix_;
};

struct Architecture {
  const char* name;  // general.architecture
  // Fills everything but arch_name, name and n_vocab (ReadModelConfig's), then checked there.
  Status (*read)(const MetadataReader& meta, ModelConfig* config);
};

// The architectures kvserve runs, in the order its errors list them.
std::span<const Architecture> Architectures();

// The shared dimensions every transformer here has (embedding_length, block_count,
// feed_forward_length, head counts and sizes, context_length, rms epsilon).
Status ReadTransformerDims(const MetadataReader& meta, ModelConfig* c);
// rope.dimension_count, rope.freq_base and rope.scaling (linear or none) into *rope.
Status ReadRope(const MetadataReader& meta, const ModelConfig& c, RopeSpec* rope);

// attention.sliding_window (positions a local layer's query sees, itself included; absent or
// 0: every layer global) and attention.sliding_window_pattern (one flag per layer, or n: every
// n-th layer global; absent: default_pattern) into the layers' attention, as llama.cpp reads
// them. Call after the layers exist.
Status ReadSlidingWindows(const MetadataReader& meta, int32_t default_pattern, ModelConfig* c);

// Per-family readers (model/arch/*.cc).
Status ReadLlamaFamily(const MetadataReader& meta, ModelConfig* config);  // llama, mistral
Status ReadQwen2(const MetadataReader& meta, ModelConfig* config);
Status ReadQwen3(const MetadataReader& meta, ModelConfig* config);
Status ReadGemma3(const MetadataReader& meta, ModelConfig* config);  // gemma3.cc

}  // namespace kvs
