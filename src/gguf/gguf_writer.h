// Writes GGUF v3 files. Tests use it to build tiny models of every architecture and dtype,
// and to build corrupt files on purpose.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "gguf/gguf_types.h"
#include "tensor/dtype.h"

namespace kvs::gguf {

class Writer {
 public:
  explicit Writer(uint64_t alignment = 32) : alignment_(alignment) {}

  void Set(std::string key, Value value);
  // dims in GGML order (dims[0] = row length); bytes must match the type's size. A tensor
  // of the same name is replaced.
  void AddTensor(std::string name, std::vector<uint64_t> dims, DType type,
                 std::vector<uint8_t> bytes);
  // Convenience: stores F32 values converted to `type` (f32, f16, bf16, q8_0, q4_0).
  void AddTensorF32(std::string name, std::vector<uint64_t> dims, DType type,
                    const std::vector<float>& values);

  std::vector<uint8_t> Serialize() const;
  Status WriteFile(const std::string& path) const;

 private:
  struct PendingTensor {
    std::string name;
    std::vector<uint64_t> dims;
    DType type;
    std::vector<uint8_t> bytes;
  };
  uint64_t alignment_;
  std::vector<std::pair<std::string, Value>> metadata_;
  std::vector<PendingTensor> tensors_;
};

}  // namespace kvs::gguf
