// A thread in front of the Engine: Submit and Cancel may be called from any thread; one loop
// thread owns the Engine, applies queued submissions and cancellations between steps, and runs
// steps while there is work (sleeping on a condition variable when there is none). Token
// callbacks run on the loop thread, inside the step: they should only hand the event on (the
// API queues it for its front-end thread, src/api/token_dispatcher.h); they may call Cancel.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>

#include "engine/engine.h"
#include "engine/spec/spec_runtime.h"

namespace kvs {

// A snapshot of the engine's load, published after every step (for metrics and tests).
struct EngineLoad {
  int32_t running = 0;
  int32_t waiting = 0;
  int32_t free_blocks = 0;
  int32_t usable_blocks = 0;
  int64_t steps = 0;
  int64_t tokens_computed = 0;
  int64_t preemptions = 0;
  int64_t prefix_queries = 0;
  int64_t prefix_hits = 0;
  int64_t spec_drafts = 0;  // EngineStepStats' speculative decoding totals
  int64_t spec_draft_tokens = 0;
  int64_t spec_accepted_tokens = 0;
  int64_t evicted_tokens = 0;  // EngineStepStats' token eviction totals
  int64_t compactions = 0;
  int64_t blocks_freed_by_compaction = 0;
};

class AsyncEngine {
 public:
  // spec: the drafter (and what it reads) when the engine speculates.
  // eviction_policy: as Engine's (null: made from config.eviction.policy).
  // tiers: the tiers under the prefix cache, in the order they are asked (none when empty).
  // after_step: runs on the loop thread after the commands of each pass are applied and after
  // each step has published its totals (load()), and once more after the cancellations of the
  // shutdown: where the API hands the token events the callbacks kept to its own thread.
  AsyncEngine(const EngineConfig& config, std::unique_ptr<StepRunner> runner, SpecRuntime spec = {},
              std::unique_ptr<EvictionPolicy> eviction_policy = nullptr, KvTiers tiers = {},
              std::function<void()> after_step = nullptr);
  ~AsyncEngine();  // Shutdown()

  // Validates at once (bad input is an error here, not a callback) and queues the request.
  Expected<RequestId> Submit(std::vector<int32_t> prompt, const RequestOptions& options,
                             TokenCallback on_token);
  // Cancels before the next step: its blocks are freed and each live choice gets kCancelled.
  void Cancel(RequestId id);
  // Cancels every request queued or running before the next step.
  void CancelAll();
  // Cancels everything still queued or running, writes what the tiers lack (bounded:
  // KvConnectors::Flush) and stops the loop thread.
  void Shutdown();
  // Runs task on the loop thread between steps (what must touch the engine's state: the prefix
  // cache, the disk tier's offers); the future is ready when it ran. After Shutdown the task
  // never runs and the future holds a broken promise.
  std::future<void> RunOnLoop(std::function<void(Engine&)> task);
  // The tiers in the order they are asked, and the one labelled name (null: none); a tier's
  // stats() and WaitForWrites may be called from any thread.
  const KvTiers& tiers() const { return engine_.connectors().tiers(); }
  KvTier* tier(std::string_view name) const { return engine_.connectors().tier(name); }

  EngineLoad load() const;
  const EngineConfig& config() const { return engine_.config(); }

 private:
  // Shutdown's last act on the loop: every tier writes what it lacks (bounded), one log line
  // each.
  void FlushTiers();
  struct Command {
    RequestId id = 0;
    bool cancel = false;
    std::vector<int32_t> prompt;
    RequestOptions options;
    TokenCallback on_token;
    std::function<void(Engine&)> task;  // RunOnLoop's
    std::shared_ptr<std::promise<void>> done;
  };
  void Loop();
  void ApplyCommands(std::deque<Command>& commands);
  void Stop();  // the loop's end: cancels what is left, flushes every tier
  void PublishLoad(const EngineStepStats& stats);

  std::unique_ptr<StepRunner> runner_;
  const std::function<void()> after_step_;
  SpecRuntime spec_;
  Engine engine_;  // touched only by the loop thread (and by Submit's read-only validation)
  std::atomic<RequestId> next_id_{1};
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Command> inbox_;
  bool stopping_ = false;
  EngineLoad load_;
  std::thread thread_;
};

}  // namespace kvs
