#include "gguf/gguf_types.h"

#include <cstdio>

namespace kvs::gguf {

std::string_view ValueTypeName(ValueType t) {
  switch (t) {
    case ValueType::kUint8:
      return "u8";
    case ValueType::kInt8:
      return "i8";
    case ValueType::kUint16:
      return "u16";
    case ValueType::kInt16:
      return "i16";
    case ValueType::kUint32:
      return "u32";
    case ValueType::kInt32:
      return "i32";
    case ValueType::kFloat32:
      return "f32";
    case ValueType::kBool:
      return "bool";
    case ValueType::kString:
      return "str";
    case ValueType::kArray:
      return "arr";
    case ValueType::kUint64:
      return "u64";
    case ValueType::kInt64:
      return "i64";
    case ValueType::kFloat64:
      return "f64";
  }
  return "?";
}

bool IsIntegerType(ValueType t) {
  switch (t) {
    case ValueType::kUint8:
    case ValueType::kInt8:
    case ValueType::kUint16:
    case ValueType::kInt16:
    case ValueType::kUint32:
    case ValueType::kInt32:
    case ValueType::kUint64:
    case ValueType::kInt64:
    case ValueType::kBool:
      return true;
    default:
      return false;
  }
}

bool IsFloatType(ValueType t) {
  return t == ValueType::kFloat32 || t == ValueType::kFloat64;
}

size_t ScalarSize(ValueType t) {
  switch (t) {
    case ValueType::kUint8:
    case ValueType::kInt8:
    case ValueType::kBool:
      return 1;
    case ValueType::kUint16:
    case ValueType::kInt16:
      return 2;
    case ValueType::kUint32:
    case ValueType::kInt32:
    case ValueType::kFloat32:
      return 4;
    case ValueType::kUint64:
    case ValueType::kInt64:
    case ValueType::kFloat64:
      return 8;
    default:
      return 0;
  }
}

size_t Value::ArraySize() const {
  if (type != ValueType::kArray) return 0;
  if (array_type == ValueType::kString) return strings.size();
  if (array_type == ValueType::kArray) return arrays.size();
  if (IsFloatType(array_type)) return floats.size();
  return ints.size();
}

std::optional<uint64_t> Value::AsUint() const {
  if (!IsIntegerType(type)) return std::nullopt;
  if (type == ValueType::kUint64) return static_cast<uint64_t>(i);
  if (i < 0) return std::nullopt;
  return static_cast<uint64_t>(i);
}

std::optional<int64_t> Value::AsInt() const {
  if (!IsIntegerType(type)) return std::nullopt;
  if (type == ValueType::kUint64 && i < 0) return std::nullopt;  // above INT64_MAX
  return i;
}

std::optional<double> Value::AsFloat() const {
  if (IsFloatType(type)) return f;
  if (IsIntegerType(type))
    return type == ValueType::kUint64 ? static_cast<double>(static_cast<uint64_t>(i))
                                      : static_cast<double>(i);
  return std::nullopt;
}

std::optional<bool> Value::AsBool() const {
  if (type == ValueType::kBool) return i != 0;
  return std::nullopt;
}

const std::string* Value::AsString() const {
  return type == ValueType::kString ? &str : nullptr;
}

std::string Value::ToString(size_t max_items) const {
  char buf[64];
  switch (type) {
    case ValueType::kString:
      return "\"" + (str.size() > 120 ? str.substr(0, 120) + "..." : str) + "\"";
    case ValueType::kBool:
      return i ? "true" : "false";
    case ValueType::kFloat32:
    case ValueType::kFloat64:
      std::snprintf(buf, sizeof(buf), "%g", f);
      return buf;
    case ValueType::kUint64:
      std::snprintf(buf, sizeof(buf), "%llu", static_cast<unsigned long long>(i));
      return buf;
    case ValueType::kArray: {
      size_t n = ArraySize();
      std::string out = "[";
      for (size_t k = 0; k < n && k < max_items; ++k) {
        if (k) out += ", ";
        if (array_type == ValueType::kString) {
          out += "\"" + strings[k] + "\"";
        } else if (array_type == ValueType::kArray) {
          out += arrays[k].ToString(max_items);
        } else if (IsFloatType(array_type)) {
          std::snprintf(buf, sizeof(buf), "%g", floats[k]);
          out += buf;
        } else {
          std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(ints[k]));
          out += buf;
        }
      }
      if (n > max_items)
        out += ", ... (" + std::to_string(n) + " " + std::string(ValueTypeName(array_type)) + ")";
      return out + "]";
    }
    default:
      std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(i));
      return buf;
  }
}

Value Value::Uint32(uint32_t v) {
  Value x;
  x.type = ValueType::kUint32;
  x.i = v;
  return x;
}
Value Value::Int32(int32_t v) {
  Value x;
  x.type = ValueType::kInt32;
  x.i = v;
  return x;
}
Value Value::Uint64(uint64_t v) {
  Value x;
  x.type = ValueType::kUint64;
  x.i = static_cast<int64_t>(v);
  return x;
}
Value Value::Float32(float v) {
  Value x;
  x.type = ValueType::kFloat32;
  x.f = v;
  return x;
}
Value Value::Bool(bool v) {
  Value x;
  x.type = ValueType::kBool;
  x.i = v ? 1 : 0;
  return x;
}
Value Value::String(std::string v) {
  Value x;
  x.type = ValueType::kString;
  x.str = std::move(v);
  return x;
}
Value Value::StringArray(std::vector<std::string> v) {
  Value x;
  x.type = ValueType::kArray;
  x.array_type = ValueType::kString;
  x.strings = std::move(v);
  return x;
}
Value Value::Float32Array(std::vector<float> v) {
  Value x;
  x.type = ValueType::kArray;
  x.array_type = ValueType::kFloat32;
  x.floats.assign(v.begin(), v.end());
  return x;
}
Value Value::Int32Array(std::vector<int32_t> v) {
  Value x;
  x.type = ValueType::kArray;
  x.array_type = ValueType::kInt32;
  x.ints.assign(v.begin(), v.end());
  return x;
}

}  // namespace kvs::gguf
