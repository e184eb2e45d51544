// CoalescedSnapshot (GET /v1/kv/state's guard for the engine loop): callers that ask while a
// snapshot is due share it, every caller gets one that started after it asked, and snapshots
// start at least the interval apart.
#include "server/coalesced_snapshot.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <stdexcept>
#include <thread>
#include <vector>

namespace kvs::server {
namespace {

using namespace std::chrono_literals;

struct Snap {
  int generation = 0;
  std::chrono::steady_clock::time_point started;
};

TEST(CoalescedSnapshot, OneCallerAtATimeGetsANewSnapshotEachTime) {
  int taken = 0;
  CoalescedSnapshot<Snap> s(0ms, [&] {
    return std::make_shared<const Snap>(Snap{++taken, std::chrono::steady_clock::now()});
  });
  EXPECT_EQ(s.Get()->generation, 1);
  EXPECT_EQ(s.Get()->generation, 2);
  EXPECT_EQ(s.Get()->generation, 3);
}

TEST(CoalescedSnapshot, CallersWaitingTogetherShareTheNextSnapshot) {
  std::atomic<int> taken{0};
  std::promise<void> release_first;
  std::shared_future<void> first_released = release_first.get_future().share();
  CoalescedSnapshot<Snap> s(0ms, [&] {
    const int g = ++taken;
    if (g == 1) first_released.wait();  // the first walk is slow: the others line up behind it
    return std::make_shared<const Snap>(Snap{g, std::chrono::steady_clock::now()});
  });
  std::future<int> first = std::async(std::launch::async, [&] { return s.Get()->generation; });
  while (taken.load() < 1) std::this_thread::yield();
  // These ask after the first snapshot started: it is too old for them, the next one is theirs.
  constexpr int kCallers = 8;
  std::vector<std::future<int>> later;
  for (int i = 0; i < kCallers; ++i) {
    later.push_back(std::async(std::launch::async, [&] { return s.Get()->generation; }));
  }
  while (s.waiting() < kCallers) std::this_thread::yield();
  release_first.set_value();
  EXPECT_EQ(first.get(), 1);
  for (auto& f : later) EXPECT_EQ(f.get(), 2);
  EXPECT_EQ(taken.load(), 2);  // nine callers, two walks
}

TEST(CoalescedSnapshot, SnapshotsStartAtLeastTheIntervalApart) {
  int taken = 0;
  constexpr auto kInterval = 30ms;
  CoalescedSnapshot<Snap> s(kInterval, [&] {
    return std::make_shared<const Snap>(Snap{++taken, std::chrono::steady_clock::now()});
  });
  auto previous = s.Get();
  for (int i = 0; i < 4; ++i) {
    const auto asked = std::chrono::steady_clock::now();
    auto next = s.Get();
    EXPECT_EQ(next->generation, previous->generation + 1);
    EXPECT_GE(next->started - previous->started, kInterval);
    EXPECT_GE(next->started, asked);  // taken after it was asked for
    previous = next;
  }
}

TEST(CoalescedSnapshot, AFailedSnapshotReachesItsCallerAndTheNextOneIsTaken) {
  int taken = 0;
  CoalescedSnapshot<Snap> s(0ms, [&]() -> std::shared_ptr<const Snap> {
    if (++taken == 1) throw std::runtime_error("walk failed");
    return std::make_shared<const Snap>(Snap{taken, std::chrono::steady_clock::now()});
  });
  EXPECT_THROW(s.Get(), std::runtime_error);
  EXPECT_EQ(s.Get()->generation, 2);
}

}  // namespace
}  // namespace kvs::server
