#include "model/weights_digest.h"

#include <algorithm>
#include <atomic>
#include <system_error>
#include <thread>
#include <vector>

namespace kvs {

Digest128 DigestFileBytes(const uint8_t* data, size_t size) {
  const size_t n_chunks = std::max<size_t>(1, (size + kDigestChunkBytes - 1) / kDigestChunkBytes);
  std::vector<Digest128> chunks(n_chunks);
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n_chunks;) {
      const size_t begin = i * kDigestChunkBytes;
      chunks[i] = DigestBytes(data + begin, std::min(kDigestChunkBytes, size - begin));
    }
  };
  // Loading runs before any thread pool exists; hashing is memory-bound, so a few threads do.
  const size_t n_threads =
      std::min<size_t>({n_chunks, std::max(1u, std::thread::hardware_concurrency()), 8});
  std::vector<std::thread> threads;
  for (size_t t = 1; t < n_threads; ++t) {
    try {
      threads.emplace_back(work);
    } catch (const std::system_error&) {
      break;  // a thread limit: the threads already started, and this one, do the rest
    }
  }
  work();
  for (std::thread& t : threads) t.join();
  DigestBuilder d;
  d.Text("kvserve-weights").Int(static_cast<int64_t>(size));
  for (const Digest128& c : chunks) d.Add(c);
  return d.Finish();
}

}  // namespace kvs
