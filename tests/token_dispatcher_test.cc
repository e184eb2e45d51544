// The API's token dispatcher (src/api/token_dispatcher.h): a request's first event and its end
// wake the thread at once; other events may wait for the next wake-up (at most kMaxDeferral of
// the dispatcher's clock), and a flush with nothing new still delivers what waits past it.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "api/token_dispatcher.h"
#include "gguf/gguf_reader.h"
#include "testing/tiny_model.h"

namespace kvs::token_dispatcher_test {
namespace {

using TimePoint = std::chrono::steady_clock::time_point;

struct Delivered {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int32_t> tokens;
  // Waits (bounded: a failure, not a hang) until n tokens were delivered.
  bool WaitFor(size_t n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(10), [&] { return tokens.size() >= n; });
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu);
    return tokens.size();
  }
};

std::unique_ptr<Tokenizer> TinyTokenizer() {
  auto f = gguf::File::FromBytes(testing::MakeTinyModel({}));
  EXPECT_TRUE(f.ok()) << f.error();
  auto t = Tokenizer::FromGguf(**f);
  EXPECT_TRUE(t.ok()) << t.error();
  return t.ok() ? std::move(*t) : nullptr;
}

// Until the dispatcher's thread sleeps again after a delivery (bounded).
bool WaitIdle(kvserve::TokenDispatcher& d) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!d.idle()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::yield();
  }
  return true;
}

kvs::TokenEvent Event(int32_t token, bool finished = false) {
  kvs::TokenEvent e{
      1, 0, token, finished, finished ? FinishReason::kLength : FinishReason::kNone, {}, 0.f, {}};
  return e;
}

TEST(TokenDispatcher, DeferredEventsAreDeliveredByALaterFlushEvenWithNothingNew) {
  auto tokenizer = TinyTokenizer();
  ASSERT_NE(tokenizer, nullptr);
  const std::vector<std::string> labels;
  TimePoint now{};  // the loop thread's clock; only Flush reads it
  Delivered got;    // before d: it outlives the dispatcher's last delivery
  kvserve::TokenDispatcher d(*tokenizer, &labels, [&now] { return now; });
  kvs::TokenCallback cb = d.Bind([&got](const kvserve::TokenEvent& e) {
    std::lock_guard<std::mutex> lock(got.mu);
    got.tokens.push_back(e.token);
    got.cv.notify_all();
  });
  ASSERT_TRUE(WaitIdle(d));
  now += std::chrono::seconds(1);
  cb(Event(40));  // the first event: delivered at once
  d.Flush();
  ASSERT_TRUE(got.WaitFor(1));
  ASSERT_TRUE(WaitIdle(d));
  // A second one within kMaxDeferral of that wake-up may wait; a flush past it, with no event of
  // its own, delivers it.
  now += kvserve::TokenDispatcher::kMaxDeferral / 4;
  cb(Event(41));
  d.Flush();
  EXPECT_EQ(got.size(), 1u) << "a second event waits for the next wake-up";
  now += kvserve::TokenDispatcher::kMaxDeferral;
  d.Flush();
  ASSERT_TRUE(got.WaitFor(2));
  // The end wakes the thread at once, whatever the clock.
  cb(Event(42));
  d.Flush();
  cb(Event(43, /*finished=*/true));
  d.Flush();
  ASSERT_TRUE(got.WaitFor(4));
  d.Drain();
  EXPECT_EQ(got.tokens, (std::vector<int32_t>{40, 41, 42, 43}));
}

TEST(TokenDispatcher, DrainDeliversWhatStillWaits) {
  auto tokenizer = TinyTokenizer();
  ASSERT_NE(tokenizer, nullptr);
  const std::vector<std::string> labels;
  TimePoint now{};
  Delivered got;
  kvserve::TokenDispatcher d(*tokenizer, &labels, [&now] { return now; });
  kvs::TokenCallback cb = d.Bind([&got](const kvserve::TokenEvent& e) {
    std::lock_guard<std::mutex> lock(got.mu);
    got.tokens.push_back(e.token);
    got.cv.notify_all();
  });
  ASSERT_TRUE(WaitIdle(d));
  now += std::chrono::seconds(1);
  cb(Event(40));
  d.Flush();
  ASSERT_TRUE(got.WaitFor(1));
  ASSERT_TRUE(WaitIdle(d));
  cb(Event(41));  // deferred: the clock has not moved
  d.Flush();
  d.Drain();
  EXPECT_EQ(got.size(), 2u);
}

}  // namespace
}  // namespace kvs::token_dispatcher_test
