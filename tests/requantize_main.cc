// requantize IN.gguf OUT.gguf MIX: copies an F32/F16 GGUF with its 2-D weight matrices
// quantized, for tests that need quantized weights of a real model without the peer's
// quantizer. MIX is q8_0, q4_0, q4_k_m (Q4_K, with Q6_K for token_embd/output and
// ffn_down, as llama.cpp's Q4_K_M gives most of them), q5_k_m (the same with Q5_K) or q6_k.
// A matrix whose rows do not divide into the chosen type's blocks keeps its type.
#include <cstdio>
#include <string>
#include <vector>

#include "gguf/gguf_reader.h"
#include "gguf/gguf_writer.h"
#include "tensor/dtype.h"
#include "tensor/kquants.h"
#include "tensor/quantize.h"

namespace {

using kvs::DType;

bool Quantize(DType t, const float* src, uint8_t* dst, int64_t n) {
  switch (t) {
    case DType::kQ8_0:
    case DType::kQ4_0:
      kvs::QuantizeRow(t, src, dst, n);
      return true;
    case DType::kQ4_K:
      kvs::QuantizeRowQ4_K(src, dst, n);
      return true;
    case DType::kQ5_K:
      kvs::QuantizeRowQ5_K(src, dst, n);
      return true;
    case DType::kQ6_K:
      kvs::QuantizeRowQ6_K(src, dst, n);
      return true;
    default:
      return false;
  }
}

DType TypeFor(const std::string& mix, const std::string& name) {
  const bool wide = name == "output.weight" || name == "token_embd.weight" ||
                    name.find("ffn_down") != std::string::npos;
  if (mix == "q8_0") return DType::kQ8_0;
  if (mix == "q4_0") return DType::kQ4_0;
  if (mix == "q6_k") return DType::kQ6_K;
  if (mix == "q4_k_m") return wide ? DType::kQ6_K : DType::kQ4_K;
  if (mix == "q5_k_m") return wide ? DType::kQ6_K : DType::kQ5_K;
  return DType::kF32;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: requantize IN.gguf OUT.gguf q8_0|q4_0|q4_k_m|q5_k_m|q6_k\n");
    return 2;
  }
  const std::string mix = argv[3];
  if (TypeFor(mix, "x") == DType::kF32) {
    std::fprintf(stderr, "error: unknown mix %s\n", mix.c_str());
    return 2;
  }
  auto file = kvs::gguf::File::Open(argv[1], kvs::gguf::LoadMode::kRead);
  if (!file.ok()) {
    std::fprintf(stderr, "error: %s\n", file.error().c_str());
    return 1;
  }
  kvs::gguf::Writer writer((*file)->alignment());
  for (const auto& [key, value] : (*file)->metadata()) writer.Set(key, value);
  int quantized = 0;
  for (const kvs::gguf::TensorInfo& t : (*file)->tensors()) {
    std::vector<uint8_t> bytes(t.data, t.data + t.n_bytes);
    const DType want = TypeFor(mix, t.name);
    const int64_t cols = static_cast<int64_t>(t.dims[0]);
    const bool matrix = t.dims.size() == 2 && (t.type == DType::kF32 || t.type == DType::kF16);
    if (matrix && cols % kvs::Info(want).block_elems == 0) {
      const int64_t rows = static_cast<int64_t>(t.dims[1]);
      const size_t in_row = kvs::RowBytes(t.type, static_cast<size_t>(cols));
      const size_t out_row = kvs::RowBytes(want, static_cast<size_t>(cols));
      std::vector<float> row(static_cast<size_t>(cols));
      std::vector<uint8_t> out(out_row * static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) {
        kvs::DequantizeRow(t.type, t.data + r * in_row, row.data(), cols);
        if (!Quantize(want, row.data(), out.data() + r * out_row, cols)) return 1;
      }
      writer.AddTensor(t.name, t.dims, want, std::move(out));
      ++quantized;
    } else {
      writer.AddTensor(t.name, t.dims, t.type, std::move(bytes));
    }
  }
  if (quantized == 0) {
    // A copy with nothing requantized would make any test built on it pass vacuously.
    std::fprintf(stderr, "error: %s has no F32 or F16 matrix whose rows divide into %s blocks\n",
                 argv[1], mix.c_str());
    return 1;
  }
  if (kvs::Status st = writer.WriteFile(argv[2]); !st.ok()) {
    std::fprintf(stderr, "error: %s\n", st.message().c_str());
    return 1;
  }
  std::fprintf(stderr, "requantize: %d matrices to %s in %s\n", quantized, mix.c_str(), argv[2]);
  return 0;
}
