#include "gguf/gguf_writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/check.h"
#include "tensor/quantize.h"

namespace kvs::gguf {
namespace {

class ByteSink {
 public:
  template <typename T>
  void Put(T v) {
    size_t at = bytes.size();
    bytes.resize(at + sizeof(T));
    std::memcpy(bytes.data() + at, &v, sizeof(T));
  }
  void PutString(const std::string& s) {
    Put<uint64_t>(s.size());
    bytes.insert(bytes.end(), s.begin(), s.end());
  }
  void PadTo(uint64_t alignment) {
    while (bytes.size() % alignment) bytes.push_back(0);
  }
  std::vector<uint8_t> bytes;
};

void PutScalar(ByteSink& s, ValueType t, int64_t i, double f) {
  switch (t) {
    case ValueType::kUint8:
      s.Put<uint8_t>(static_cast<uint8_t>(i));
      break;
    case ValueType::kInt8:
      s.Put<int8_t>(static_cast<int8_t>(i));
      break;
    case ValueType::kUint16:
      s.Put<uint16_t>(static_cast<uint16_t>(i));
      break;
    case ValueType::kInt16:
      s.Put<int16_t>(static_cast<int16_t>(i));
      break;
    case ValueType::kUint32:
      s.Put<uint32_t>(static_cast<uint32_t>(i));
      break;
    case ValueType::kInt32:
      s.Put<int32_t>(static_cast<int32_t>(i));
      break;
    case ValueType::kUint64:
      s.Put<uint64_t>(static_cast<uint64_t>(i));
      break;
    case ValueType::kInt64:
      s.Put<int64_t>(i);
      break;
    case ValueType::kFloat32:
      s.Put<float>(static_cast<float>(f));
      break;
    case ValueType::kFloat64:
      s.Put<double>(f);
      break;
    case ValueType::kBool:
      s.Put<uint8_t>(i ? 1 : 0);
      break;
    default:
      KVS_CHECK(false && "not a scalar type");
  }
}

void PutValue(ByteSink& s, const Value& v) {
  if (v.type == ValueType::kString) {
    s.PutString(v.str);
  } else if (v.type == ValueType::kArray) {
    s.Put<uint32_t>(static_cast<uint32_t>(v.array_type));
    s.Put<uint64_t>(v.ArraySize());
    if (v.array_type == ValueType::kString) {
      for (const auto& str : v.strings) s.PutString(str);
    } else if (v.array_type == ValueType::kArray) {
      for (const auto& a : v.arrays) PutValue(s, a);
    } else if (IsFloatType(v.array_type)) {
      for (double f : v.floats) PutScalar(s, v.array_type, 0, f);
    } else {
      for (int64_t i : v.ints) PutScalar(s, v.array_type, i, 0);
    }
  } else {
    PutScalar(s, v.type, v.i, v.f);
  }
}

}  // namespace

void Writer::Set(std::string key, Value value) {
  for (auto& [k, v] : metadata_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(std::move(key), std::move(value));
}

void Writer::AddTensor(std::string name, std::vector<uint64_t> dims, DType type,
                       std::vector<uint8_t> bytes) {
  for (auto& t : tensors_) {
    if (t.name == name) {
      t = {std::move(name), std::move(dims), type, std::move(bytes)};
      return;
    }
  }
  tensors_.push_back({std::move(name), std::move(dims), type, std::move(bytes)});
}

void Writer::AddTensorF32(std::string name, std::vector<uint64_t> dims, DType type,
                          const std::vector<float>& values) {
  uint64_t cols = dims.empty() ? 1 : dims[0];
  uint64_t rows = cols ? values.size() / cols : 0;
  KVS_CHECK(rows * cols == values.size());
  AddTensor(
      std::move(name), std::move(dims), type,
      QuantizeMatrix(type, values.data(), static_cast<int64_t>(rows), static_cast<int64_t>(cols)));
}

std::vector<uint8_t> Writer::Serialize() const {
  ByteSink s;
  s.Put<uint32_t>(0x46554747);
  s.Put<uint32_t>(3);
  s.Put<uint64_t>(tensors_.size());
  bool has_alignment = false;
  for (const auto& kv : metadata_) has_alignment |= kv.first == "general.alignment";
  s.Put<uint64_t>(metadata_.size() + ((alignment_ != 32 && !has_alignment) ? 1 : 0));
  for (const auto& [k, v] : metadata_) {
    s.PutString(k);
    s.Put<uint32_t>(static_cast<uint32_t>(v.type));
    PutValue(s, v);
  }
  if (alignment_ != 32 && !has_alignment) {
    s.PutString("general.alignment");
    s.Put<uint32_t>(static_cast<uint32_t>(ValueType::kUint32));
    s.Put<uint32_t>(static_cast<uint32_t>(alignment_));
  }
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    s.PutString(t.name);
    s.Put<uint32_t>(static_cast<uint32_t>(t.dims.size()));
    for (uint64_t d : t.dims) s.Put<uint64_t>(d);
    s.Put<uint32_t>(static_cast<uint32_t>(t.type));
    s.Put<uint64_t>(offset);
    offset += (t.bytes.size() + alignment_ - 1) / alignment_ * alignment_;
  }
  s.PadTo(alignment_);
  for (const auto& t : tensors_) {
    s.bytes.insert(s.bytes.end(), t.bytes.begin(), t.bytes.end());
    s.PadTo(alignment_);
  }
  return std::move(s.bytes);
}

Status Writer::WriteFile(const std::string& path) const {
  std::vector<uint8_t> bytes = Serialize();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f)
    return Status::Error(StrFormat("cannot write '%s': %s", path.c_str(), std::strerror(errno)));
  size_t n = std::fwrite(bytes.data(), 1, bytes.size(), f);
  bool ok = n == bytes.size() && std::fclose(f) == 0;
  if (!ok) return Status::Error(StrFormat("short write to '%s'", path.c_str()));
  return Status::Ok();
}

}  // namespace kvs::gguf
