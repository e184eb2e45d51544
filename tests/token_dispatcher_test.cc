// The API's token dispatcher (src/api/token_dispatcher.h): a request's first event and its end
// wake the thread at once; other events may wait for the next wake-up (at most kMaxDeferral of
// the dispatcher's clock), and a flush with nothing new still delivers what waits past it.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <memory>
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

// A dispatcher on a clock the test moves, delivering into got; its thread asleep to start with.
class TokenDispatcherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tokenizer_ = TinyTokenizer();
    ASSERT_NE(tokenizer_, nullptr);
    d_ = std::make_unique<kvserve::TokenDispatcher>(*tokenizer_, &labels_, [this] { return now_; });
    cb_ = d_->Bind([this](const kvserve::TokenEvent& e) {
      std::lock_guard<std::mutex> lock(got_.mu);
      got_.tokens.push_back(e.token);
      got_.cv.notify_all();
    });
    ASSERT_TRUE(WaitIdle(*d_));
    now_ += std::chrono::seconds(1);
  }
  void TearDown() override {
    if (d_) d_->Drain();  // before got_ goes: the thread may still deliver into it
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  const std::vector<std::string> labels_;
  TimePoint now_{};  // only Flush, on this thread, reads it
  Delivered got_;
  std::unique_ptr<kvserve::TokenDispatcher> d_;
  kvs::TokenCallback cb_;
};

TEST_F(TokenDispatcherTest, DeferredEventsAreDeliveredByALaterFlushEvenWithNothingNew) {
  cb_(Event(40));  // the first event: delivered at once
  d_->Flush();
  ASSERT_TRUE(got_.WaitFor(1));
  ASSERT_TRUE(WaitIdle(*d_));
  // A second one within kMaxDeferral of that wake-up waits; a flush past it, with no event of its
  // own, delivers it.
  now_ += kvserve::TokenDispatcher::kMaxDeferral / 4;
  cb_(Event(41));
  d_->Flush();
  EXPECT_EQ(got_.size(), 1u) << "a second event waits for the next wake-up";
  now_ += kvserve::TokenDispatcher::kMaxDeferral;
  d_->Flush();
  ASSERT_TRUE(got_.WaitFor(2));
  // The end wakes the thread at once, whatever the clock.
  cb_(Event(42));
  d_->Flush();
  cb_(Event(43, /*finished=*/true));
  d_->Flush();
  ASSERT_TRUE(got_.WaitFor(4));
  d_->Drain();
  EXPECT_EQ(got_.tokens, (std::vector<int32_t>{40, 41, 42, 43}));
}

TEST_F(TokenDispatcherTest, DrainDeliversWhatStillWaits) {
  cb_(Event(40));
  d_->Flush();
  ASSERT_TRUE(got_.WaitFor(1));
  ASSERT_TRUE(WaitIdle(*d_));
  cb_(Event(41));  // deferred: the clock has not moved
  d_->Flush();
  d_->Drain();
  EXPECT_EQ(got_.size(), 2u);
}

}  // namespace
}  // namespace kvs::token_dispatcher_test
