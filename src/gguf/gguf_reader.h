// Reads GGUF v2/v3 files, mapped or read into memory. Every count, length, offset and size is
// checked against the file before use, so a corrupt file yields a one-line error, never a crash
// or a huge allocation. GGUF v1 is rejected with a message that says so. Tensor data must be
// laid out as llama.cpp requires: contiguous in file order, each tensor padded to the alignment,
// no unclaimed data after the last one; so no two tensors share bytes and every size is the one
// its type and shape give.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/page_memory.h"
#include "core/status.h"
#include "gguf/gguf_types.h"
#include "tensor/dtype.h"

namespace kvs::gguf {

struct TensorInfo {
  std::string name;
  std::vector<uint64_t> dims;  // GGML order: dims[0] is the innermost (row length)
  DType type = DType::kF32;
  uint64_t offset = 0;  // relative to the data section
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
  const uint8_t* data = nullptr;  // points into the mapping

  uint64_t rows() const { return dims.empty() ? 1 : n_elements / dims[0]; }
};

// kMap maps the file (pages load on first touch and are shared with the page cache);
// kRead copies it into anonymous huge-page memory (AllocatePages, core/page_memory.h), which
// streams faster during decode.
enum class LoadMode { kMap, kRead };

class File {
 public:
  // Maps (or reads) and parses `path`.
  static Expected<std::unique_ptr<File>> Open(const std::string& path,
                                              LoadMode mode = LoadMode::kMap);
  // Parses an in-memory image (tests); the bytes are owned by the File.
  static Expected<std::unique_ptr<File>> FromBytes(std::vector<uint8_t> bytes);

  ~File();
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  size_t size() const { return size_; }
  // The whole file's bytes as loaded (tensor data may since have been repacked in place).
  const uint8_t* bytes() const { return base_; }
  const std::string& path() const { return path_; }

  const std::vector<std::pair<std::string, Value>>& metadata() const { return metadata_; }
  const Value* Find(std::string_view key) const;
  std::optional<uint64_t> GetUint(std::string_view key) const;
  std::optional<int64_t> GetInt(std::string_view key) const;
  std::optional<double> GetFloat(std::string_view key) const;
  std::optional<bool> GetBool(std::string_view key) const;
  std::optional<std::string> GetString(std::string_view key) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* FindTensor(std::string_view name) const;
  // A tensor's bytes for rewriting in place (load-time repacking), or null when the file is a
  // read-only mapping (LoadMode::kMap). The caller owns the consequences: File itself never
  // reads tensor data.
  uint8_t* MutableTensorData(const TensorInfo& t) {
    return writable_ ? const_cast<uint8_t*>(t.data) : nullptr;
  }

 private:
  File() = default;
  Status Parse();

  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  void* mapping_ = nullptr;     // the file's mapping (kMap), else null
  bool writable_ = false;       // the bytes are a private copy (kRead, FromBytes)
  PageMemory pages_;            // the bytes read into huge pages (kRead)
  std::vector<uint8_t> owned_;  // the bytes of FromBytes
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, Value>> metadata_;
  std::vector<TensorInfo> tensors_;
};

}  // namespace kvs::gguf
