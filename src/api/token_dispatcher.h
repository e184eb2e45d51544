// The API's side of the token streams: the engine's loop only queues plain kvs::TokenEvents
// here (token ids and logprob numbers), handed over once per step; the dispatcher's own thread
// turns them into kvserve::TokenEvents (streaming detokenization, the top logprobs' texts) and
// runs each request's callback, so neither that work nor what a callback does (the server's stop
// strings, logprob JSON and metrics) lengthens a step.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/request.h"
#include "kvserve/kvserve.h"
#include "tokenizer/tokenizer.h"

namespace kvserve {

class TokenDispatcher {
 public:
  // tier_labels: the engine's tiers' labels in list order (a TokenEvent's tier_tokens follow
  // it), filled before the first request; it outlives the dispatcher.
  // now: the clock Flush reads (tests give their own).
  using Clock = std::function<std::chrono::steady_clock::time_point()>;
  TokenDispatcher(const kvs::Tokenizer& tokenizer, const std::vector<std::string>* tier_labels,
                  Clock now = std::chrono::steady_clock::now);
  ~TokenDispatcher();  // Drain()

  // The engine's callback for one request: each event is kept for on_token, which runs on the
  // dispatcher's thread after the next Flush. Called on the engine's loop thread only.
  kvs::TokenCallback Bind(TokenCallback on_token);
  // Hands the events kept since the last Flush to the dispatcher's thread: on the loop thread,
  // after each step has published its totals (so a callback sees them). The thread is woken at
  // once for a request's first event or its end, else at most every kMaxDeferral: on a small
  // model a step takes about a millisecond, and a wake-up per step (the thread taking a core
  // from the pool's spinning workers mid-step) cost 5-15% of one sequence's decode speed on a
  // 2-core host (docs/BENCHMARKS.md). A token then waits at most kMaxDeferral, or one step
  // where a step is longer.
  void Flush();
  static constexpr std::chrono::microseconds kMaxDeferral{2000};
  // Whether the thread sleeps with nothing queued (for tests: a deferral needs it asleep).
  bool idle();
  // Runs every callback still owed and stops the thread; the engine must have stopped (no
  // further events or Flush).
  void Drain();

 private:
  struct Stream {
    TokenCallback on_token;
    std::map<int32_t, kvs::StreamingDetokenizer> detokenizers;  // per choice, made on first use
    bool started = false;  // the loop thread's: an event of it was kept
  };
  struct Item {
    std::shared_ptr<Stream> stream;
    kvs::TokenEvent event;
  };
  void Loop();
  void Deliver(Stream& stream, const kvs::TokenEvent& e) const;

  const kvs::Tokenizer& tokenizer_;
  const std::vector<std::string>* tier_labels_;
  Clock now_;
  std::vector<Item> kept_;  // the loop thread's, between flushes: no lock per token
  bool urgent_ = false;     // the loop thread's: kept_ has a first event or an end
  bool deferred_ = false;   // the loop thread's: events wait in queue_ for a wake-up
  std::chrono::steady_clock::time_point last_wake_;  // the loop thread's: the last hand-off
  std::mutex mu_;
  std::condition_variable wake_;
  std::vector<Item> queue_;  // flushed, not yet delivered
  bool idle_ = false;        // the thread waits on wake_
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace kvserve
