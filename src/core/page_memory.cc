#include "core/page_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <utility>

namespace kvs {

PageMemory::~PageMemory() {
  if (data_) munmap(data_, size_);
}

PageMemory::PageMemory(PageMemory&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

PageMemory& PageMemory::operator=(PageMemory&& other) noexcept {
  if (this != &other) {
    if (data_) munmap(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

Expected<PageMemory> AllocatePages(size_t bytes, PageSize pages) {
  void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return Status::Error(std::strerror(errno));
  // Advice only: a kernel without THP refuses it, and the memory is still good.
  madvise(m, bytes, pages == PageSize::kHuge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  PageMemory mem;
  mem.data_ = static_cast<uint8_t*>(m);
  mem.size_ = bytes;
  return mem;
}

int64_t HugePageBytes(const void* p, size_t bytes) {
  std::ifstream smaps("/proc/self/smaps");
  if (!smaps) return -1;
  const uintptr_t lo = reinterpret_cast<uintptr_t>(p), hi = lo + bytes;
  bool inside = false;  // the current mapping overlaps [lo, hi)
  int64_t total = 0;
  std::string line;
  while (std::getline(smaps, line)) {
    unsigned long long start, end;
    char dash;
    // A mapping's header line: "start-end perms offset dev inode [path]", addresses in hex.
    if (std::sscanf(line.c_str(), "%llx%c%llx", &start, &dash, &end) == 3 && dash == '-' &&
        line.find(':') > line.find(' ')) {
      inside = start < hi && end > lo;
      continue;
    }
    long long kib;
    if (inside && std::sscanf(line.c_str(), "AnonHugePages: %lld kB", &kib) == 1) {
      total += kib * 1024;
    }
  }
  return std::min<int64_t>(total, static_cast<int64_t>(bytes));
}

std::string TransparentHugePagePolicy() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(f, line)) return "unknown";
  const size_t open = line.find('['), close = line.find(']');
  if (open == std::string::npos || close == std::string::npos || close < open) return "unknown";
  return line.substr(open + 1, close - open - 1);
}

}  // namespace kvs
