// One snapshot for many readers: the callers that ask while a snapshot is due share it, and
// snapshots start at least `min_interval` apart. Every caller gets a snapshot that started after
// it asked (never an older one), while the taker (GET /v1/kv/state's walk of the pool on the
// engine loop) runs at most once per interval however many clients poll.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

namespace kvs::server {

template <typename T>
class CoalescedSnapshot {
 public:
  using Clock = std::chrono::steady_clock;
  using Take = std::function<std::shared_ptr<const T>()>;

  CoalescedSnapshot(Clock::duration min_interval, Take take)
      : min_interval_(min_interval), take_(std::move(take)) {}

  std::shared_ptr<const T> Get() {
    std::unique_lock lock(mu_);
    const uint64_t want = started_ + 1;  // the first snapshot to start after now
    while (finished_ < want) {
      if (taking_) {
        ++waiting_;
        cv_.wait(lock);
        --waiting_;
        continue;
      }
      // This caller takes the next one. Callers arriving while it waits for the interval join
      // it: it has not started yet, so it starts after they asked too.
      taking_ = true;
      while (Clock::now() < last_start_ + min_interval_)
        cv_.wait_until(lock, last_start_ + min_interval_);
      const uint64_t generation = ++started_;
      last_start_ = Clock::now();
      lock.unlock();
      std::shared_ptr<const T> snapshot;
      try {
        snapshot = take_();
      } catch (...) {
        lock.lock();
        taking_ = false;
        cv_.notify_all();
        throw;
      }
      lock.lock();
      latest_ = std::move(snapshot);
      finished_ = generation;
      taking_ = false;
      cv_.notify_all();
    }
    return latest_;
  }

  // Callers waiting for another's snapshot (tests wait for them to line up).
  int waiting() const {
    std::lock_guard lock(mu_);
    return waiting_;
  }

 private:
  const Clock::duration min_interval_;
  const Take take_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool taking_ = false;
  int waiting_ = 0;
  uint64_t started_ = 0;   // snapshots begun
  uint64_t finished_ = 0;  // the generation of latest_
  Clock::time_point last_start_{};
  std::shared_ptr<const T> latest_;
};

}  // namespace kvs::server
