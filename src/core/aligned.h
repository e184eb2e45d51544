// Cache-line / SIMD aligned buffers for activations and scratch space.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <memory>
#include <new>

namespace kvs {

inline constexpr size_t kAlignment = 64;

struct AlignedFree {
  void operator()(void* p) const { std::free(p); }
};

template <typename T>
using AlignedPtr = std::unique_ptr<T[], AlignedFree>;

template <typename T>
AlignedPtr<T> AllocateAligned(size_t count) {
  size_t bytes = (count * sizeof(T) + kAlignment - 1) / kAlignment * kAlignment;
  if (bytes == 0) bytes = kAlignment;
  void* p = std::aligned_alloc(kAlignment, bytes);
  if (!p) throw std::bad_alloc();
  return AlignedPtr<T>(static_cast<T*>(p));
}

// A growable aligned float buffer; contents are not preserved on resize.
class AlignedBuffer {
 public:
  float* data() { return data_.get(); }
  const float* data() const { return data_.get(); }
  size_t size() const { return size_; }
  void Resize(size_t count) {
    if (count > capacity_) {
      data_ = AllocateAligned<float>(count);
      capacity_ = count;
    }
    size_ = count;
  }

 private:
  AlignedPtr<float> data_;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

}  // namespace kvs
