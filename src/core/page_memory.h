// Large anonymous buffers in a chosen page size: the weights read into memory (gguf::File's
// LoadMode::kRead) and the buffer `kvserve bench bandwidth` reads, so that the bandwidth
// measured is that of the memory the weights live in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"

namespace kvs {

// kHuge asks the kernel for transparent huge pages (madvise MADV_HUGEPAGE): it grants them when
// /sys/kernel/mm/transparent_hugepage/enabled is "always" or "madvise" and it finds free 2 MiB
// pages. kSmall asks it not to (MADV_NOHUGEPAGE), so the buffer stays in 4 KiB pages even under
// "always". Decode streams every weight once per token; with 4 KiB pages each row of an F16
// matrix is its own page and the TLB misses cap the bandwidth.
enum class PageSize { kHuge, kSmall };

// An owning, zero-filled, read-write anonymous mapping (munmap'ed on destruction). Its pages are
// allocated on first touch.
class PageMemory {
 public:
  PageMemory() = default;
  ~PageMemory();
  PageMemory(PageMemory&& other) noexcept;
  PageMemory& operator=(PageMemory&& other) noexcept;
  PageMemory(const PageMemory&) = delete;
  PageMemory& operator=(const PageMemory&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  friend Expected<PageMemory> AllocatePages(size_t bytes, PageSize pages);
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Maps `bytes` (> 0) of anonymous memory advised as `pages`; the error is strerror(errno).
Expected<PageMemory> AllocatePages(size_t bytes, PageSize pages);

// Bytes of [p, p + bytes) that the kernel backs with transparent huge pages now (the
// AnonHugePages of the mappings that overlap it in /proc/self/smaps, at most `bytes`), or -1
// when that file cannot be read.
int64_t HugePageBytes(const void* p, size_t bytes);

// The system's transparent huge page policy, the bracketed word of
// /sys/kernel/mm/transparent_hugepage/enabled ("always", "madvise" or "never"), or "unknown".
std::string TransparentHugePagePolicy();

}  // namespace kvs
