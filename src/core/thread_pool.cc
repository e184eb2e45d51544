#include "core/thread_pool.h"

#include <sched.h>

#include <algorithm>

#include "core/log.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVS_CPU_RELAX() _mm_pause()
#else
#define KVS_CPU_RELAX() std::this_thread::yield()
#endif

namespace kvs {
namespace {

// About 0.2-1 ms of spinning on current x86 cores: long enough to bridge the gap between
// the loops of one forward pass, short enough not to burn a core between requests.
constexpr int kSpinIterations = 1 << 14;

// Range of thread `t` out of `n_threads` over n items, aligned to `grain`.
void SplitRange(size_t n, size_t grain, int t, int n_threads, size_t* begin, size_t* end) {
  size_t chunks = (n + grain - 1) / grain;
  size_t per = chunks / n_threads, extra = chunks % n_threads;
  size_t c0 = t * per + std::min<size_t>(t, extra);
  size_t c1 = c0 + per + (static_cast<size_t>(t) < extra ? 1 : 0);
  *begin = std::min(n, c0 * grain);
  *end = std::min(n, c1 * grain);
}

}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  { std::lock_guard<std::mutex> lock(mu_); }
  wake_cv_.notify_all();
  for (auto& w : workers_) w.join();
}

int ThreadPool::DefaultThreadCount() {
#ifdef __linux__
  cpu_set_t cpus;
  if (sched_getaffinity(0, sizeof(cpus), &cpus) == 0 && CPU_COUNT(&cpus) > 0) {
    return CPU_COUNT(&cpus);
  }
#endif
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

int ThreadPool::ResolveThreadCount(int requested) {
  const int available = DefaultThreadCount();
  if (requested <= 0) return available;
  if (requested > available) {
    KVS_LOG_WARN(
        "-t %d is more than the %d CPU threads this process may use; using %d (the "
        "pool's threads spin, and more of them than cores wait on each other)",
        requested, available, available);
    return available;
  }
  return requested;
}

void ThreadPool::ParallelFor(size_t n, size_t grain,
                             const std::function<void(int, size_t, size_t)>& fn) {
  if (n == 0) return;
  grain = std::max<size_t>(1, grain);
  if (n_threads_ == 1 || n <= grain) {
    fn(0, 0, n);
    return;
  }
  job_ = &fn;
  job_n_ = n;
  job_grain_ = grain;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  // A worker about to sleep checks generation_ under mu_; taking mu_ here orders this
  // publication before that check or after its wait begins, so no wake-up is lost.
  { std::lock_guard<std::mutex> lock(mu_); }
  wake_cv_.notify_all();

  size_t b, e;
  SplitRange(n, grain, 0, n_threads_, &b, &e);
  if (b < e) fn(0, b, e);
  // Spin, then yield: on a loaded machine the worker may be waiting for this very core.
  for (int i = 0; pending_.load(std::memory_order_acquire) != 0; ++i) {
    if (i < kSpinIterations) {
      KVS_CPU_RELAX();
    } else {
      std::this_thread::yield();
    }
  }
  job_ = nullptr;
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen = generation_.load(std::memory_order_acquire);
    for (int i = 0; gen == seen && i < kSpinIterations && !stop_.load(std::memory_order_relaxed);
         ++i) {
      KVS_CPU_RELAX();
      gen = generation_.load(std::memory_order_acquire);
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      wake_cv_.wait(lock, [&] {
        return stop_.load(std::memory_order_acquire) ||
               generation_.load(std::memory_order_acquire) != seen;
      });
      gen = generation_.load(std::memory_order_acquire);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    seen = gen;
    size_t b, e;
    SplitRange(job_n_, job_grain_, index, n_threads_, &b, &e);
    if (b < e) (*job_)(index, b, e);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace kvs
