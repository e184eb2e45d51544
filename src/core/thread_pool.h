// A fixed pool of worker threads that runs data-parallel loops. It is created once by the
// frontend and passed explicitly to whatever needs it (never a global).
//
// A forward pass issues dozens of short loops per token, so waking a sleeping thread for
// each would cost more than the work on small models: workers spin for a short while after
// each loop, then fall back to sleeping on a condition variable.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvs {

class ThreadPool {
 public:
  // n_threads counts the calling thread: a pool of 1 runs everything inline.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(thread_index, begin, end) over [0, n) split into size() contiguous ranges
  // whose boundaries are multiples of `grain`. Blocks until every range is done. Not
  // reentrant: one caller at a time.
  void ParallelFor(size_t n, size_t grain, const std::function<void(int, size_t, size_t)>& fn);

  // The CPUs this process may run on: its affinity mask (taskset, a container's cpuset), else
  // std::thread::hardware_concurrency; at least 1.
  static int DefaultThreadCount();
  // The thread count to use for a user's request (-t, EngineOptions::threads): 0 or less means
  // DefaultThreadCount(); more than that is clamped to it with a warning. The workers spin
  // between loops, so a thread without a core of its own stalls every loop until the kernel
  // runs it: 1000 threads on 2 cores crawl. The constructor takes any count (tests split work
  // over more threads than cores on purpose); what comes from a user goes through here.
  static int ResolveThreadCount(int requested);

 private:
  void WorkerLoop(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  // The job is published by bumping generation_ (release) after writing the fields below.
  const std::function<void(int, size_t, size_t)>* job_ = nullptr;
  size_t job_n_ = 0;
  size_t job_grain_ = 1;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  std::mutex mu_;  // only for sleeping workers
  std::condition_variable wake_cv_;
};

}  // namespace kvs
