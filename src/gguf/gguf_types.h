// GGUF metadata values: every type the format defines, arrays (nested too) included.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvs::gguf {

enum class ValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

std::string_view ValueTypeName(ValueType t);
bool IsIntegerType(ValueType t);  // bool counts as integer here
bool IsFloatType(ValueType t);
size_t ScalarSize(ValueType t);  // 0 for string/array

struct Value {
  ValueType type = ValueType::kUint32;
  ValueType array_type = ValueType::kUint32;  // element type when type == kArray

  // Scalars: integers (and bool) in `i` (uint64 keeps its bit pattern), floats in `f`,
  // strings in `str`.
  int64_t i = 0;
  double f = 0;
  std::string str;

  // Arrays: exactly one of these is filled, by element type.
  std::vector<int64_t> ints;         // integer and bool elements
  std::vector<double> floats;        // float32/float64 elements
  std::vector<std::string> strings;  // string elements
  std::vector<Value> arrays;         // nested array elements

  size_t ArraySize() const;

  // Typed reads that convert between integer widths but never between kinds.
  std::optional<uint64_t> AsUint() const;
  std::optional<int64_t> AsInt() const;
  std::optional<double> AsFloat() const;  // integers convert too
  std::optional<bool> AsBool() const;
  const std::string* AsString() const;

  // One-line rendering for `kvserve inspect` (long arrays abbreviated).
  std::string ToString(size_t max_items = 8) const;

  static Value Uint32(uint32_t v);
  static Value Int32(int32_t v);
  static Value Uint64(uint64_t v);
  static Value Float32(float v);
  static Value Bool(bool v);
  static Value String(std::string v);
  static Value StringArray(std::vector<std::string> v);
  static Value Float32Array(std::vector<float> v);
  static Value Int32Array(std::vector<int32_t> v);
};

}  // namespace kvs::gguf
