#include "core/thread_pool.h"

#include <algorithm>

namespace kvs {
namespace {

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
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& w : workers_) w.join();
}

int ThreadPool::DefaultThreadCount() {
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

void ThreadPool::ParallelFor(size_t n, size_t grain,
                             const std::function<void(int, size_t, size_t)>& fn) {
  if (n == 0) return;
  grain = std::max<size_t>(1, grain);
  if (n_threads_ == 1 || n <= grain) {
    fn(0, 0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_n_ = n;
    job_grain_ = grain;
    pending_ = n_threads_ - 1;
    ++generation_;
  }
  start_cv_.notify_all();
  size_t b, e;
  SplitRange(n, grain, 0, n_threads_, &b, &e);
  if (b < e) fn(0, b, e);
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [this] { return pending_ == 0; });
  job_ = nullptr;
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int, size_t, size_t)>* job;
    size_t n, grain;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = job_n_;
      grain = job_grain_;
    }
    size_t b, e;
    SplitRange(n, grain, index, n_threads_, &b, &e);
    if (b < e) (*job)(index, b, e);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

}  // namespace kvs
