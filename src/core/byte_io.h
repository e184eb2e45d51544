// Little-endian byte strings for the project's file and wire formats (block files, transform
// bases, codec payloads): a writer that appends, and a reader that answers false instead of
// reading past its end, so that a truncated or damaged input is an error, never a wild read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <type_traits>
#include <vector>

namespace kvs {

// The integer T stored little-endian at p (which holds at least sizeof(T) bytes).
template <typename T>
T LoadLittleEndian(const uint8_t* p) {
  static_assert(std::is_integral_v<T>);
  uint64_t x = 0;
  for (size_t i = 0; i < sizeof(T); ++i) x |= uint64_t{p[i]} << (8 * i);
  return static_cast<T>(x);
}

class ByteWriter {
 public:
  explicit ByteWriter(std::vector<uint8_t>* out) : out_(out) {}
  void Bytes(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    out_->insert(out_->end(), b, b + n);
  }
  template <typename T>
  void Int(T v) {
    static_assert(std::is_integral_v<T>);
    for (size_t i = 0; i < sizeof(T); ++i) {
      out_->push_back(static_cast<uint8_t>(static_cast<uint64_t>(v) >> (8 * i)));
    }
  }
  // IEEE floats as the host stores them: little-endian on x86-64, the only target.
  void Floats(std::span<const float> v) { Bytes(v.data(), v.size_bytes()); }

 private:
  std::vector<uint8_t>* out_;
};

class ByteReader {
 public:
  explicit ByteReader(std::span<const uint8_t> in) : in_(in) {}
  bool Bytes(void* p, size_t n) {
    if (left() < n) return false;
    std::memcpy(p, in_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  template <typename T>
  bool Int(T* v) {
    if (left() < sizeof(T)) return false;
    *v = LoadLittleEndian<T>(in_.data() + pos_);
    pos_ += sizeof(T);
    return true;
  }
  bool Floats(std::vector<float>* v, size_t n) {  // n counted before any allocation
    if (left() / sizeof(float) < n) return false;
    v->resize(n);
    return Bytes(v->data(), n * sizeof(float));
  }
  size_t pos() const { return pos_; }
  size_t left() const { return in_.size() - pos_; }

 private:
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
};

}  // namespace kvs
