#include "engine/async_engine.h"

#include <chrono>

#include "core/log.h"

namespace kvs {

AsyncEngine::AsyncEngine(const EngineConfig& config, std::unique_ptr<StepRunner> runner,
                         SpecRuntime spec, std::unique_ptr<EvictionPolicy> eviction_policy,
                         KvTiers tiers, std::function<void()> after_step)
    : runner_(std::move(runner)),
      after_step_(std::move(after_step)),
      spec_(std::move(spec)),
      engine_(config, *runner_, spec_.drafter.get(), std::move(eviction_policy)) {
  for (auto& tier : tiers) engine_.connectors().AttachTier(std::move(tier));
  load_.usable_blocks = engine_.kv().num_usable_blocks();
  load_.free_blocks = engine_.kv().num_free_blocks();
  thread_ = std::thread([this] { Loop(); });
}

AsyncEngine::~AsyncEngine() {
  Shutdown();
}

Expected<RequestId> AsyncEngine::Submit(std::vector<int32_t> prompt, const RequestOptions& options,
                                        TokenCallback on_token) {
  // Validation reads only what never changes after construction (config, vocab, pool size).
  KVS_RETURN_IF_ERROR(engine_.ValidateRequest(prompt, options));
  const RequestId id = next_id_++;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return Status::Error("the engine is shutting down");
    inbox_.push_back(Command{id, false, std::move(prompt), options, std::move(on_token), {}, {}});
  }
  wake_.notify_one();
  return id;
}

void AsyncEngine::Cancel(RequestId id) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox_.push_back(Command{id, true, {}, {}, {}, {}, {}});
  }
  wake_.notify_one();
}

std::future<void> AsyncEngine::RunOnLoop(std::function<void(Engine&)> task) {
  auto done = std::make_shared<std::promise<void>>();
  std::future<void> future = done->get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return future;  // the promise dies unfulfilled: broken
    Command c;
    c.task = std::move(task);
    c.done = std::move(done);
    inbox_.push_back(std::move(c));
  }
  wake_.notify_one();
  return future;
}

void AsyncEngine::CancelAll() {
  Cancel(0);
}  // id 0 is never a request's

void AsyncEngine::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

EngineLoad AsyncEngine::load() const {
  std::lock_guard<std::mutex> lock(mu_);
  return load_;
}

void AsyncEngine::Loop() {
  for (;;) {
    std::deque<Command> commands;
    bool stopping;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stopping_ || !inbox_.empty() || engine_.HasWork(); });
      commands.swap(inbox_);
      stopping = stopping_;
    }
    ApplyCommands(commands);
    if (after_step_) after_step_();  // a cancellation's ends go out without waiting for a step
    if (stopping) {
      Stop();
      return;
    }
    EngineStepStats stats;
    const Status st = engine_.Step(&stats);
    if (!st.ok()) KVS_LOG_ERROR("engine step failed: %s", st.message().c_str());
    PublishLoad(stats);
    if (after_step_) after_step_();
  }
}

void AsyncEngine::ApplyCommands(std::deque<Command>& commands) {
  for (Command& c : commands) {
    if (c.task) {
      c.task(engine_);
      c.done->set_value();
      continue;
    }
    if (c.cancel) {
      if (c.id == 0) {
        engine_.CancelAll();
      } else {
        engine_.Cancel(c.id);
      }
      continue;
    }
    Status st = engine_.SubmitWithId(c.id, std::move(c.prompt), c.options, c.on_token);
    if (!st.ok() && c.on_token) {
      for (int32_t choice = 0; choice < std::max(1, c.options.n); ++choice) {
        c.on_token(TokenEvent{c.id, choice, -1, true, FinishReason::kError, st.message(), 0.f, {}});
      }
    }
  }
}

void AsyncEngine::Stop() {
  engine_.CancelAll();
  if (after_step_) after_step_();
  if (!engine_.connectors().tiers().empty()) FlushTiers();
}

void AsyncEngine::FlushTiers() {
  for (const auto& tier : engine_.connectors().tiers()) {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t offered = tier->Flush(engine_.kv(), /*wait=*/true);
    const KvTierStats s = tier->stats();
    KVS_LOG_INFO(
        "kv %.*s: flushed %lld blocks in %.0f ms; %lld blocks written this run, %.1f MiB "
        "of KV in %.1f MiB of files (%s, ratio %.2f), %lld loaded",
        static_cast<int>(tier->name().size()), tier->name().data(), static_cast<long long>(offered),
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
        static_cast<long long>(s.blocks_written), s.payload_bytes_written / 1048576.0,
        s.bytes_written / 1048576.0, BlockCodecName(tier->config().codec),
        s.bytes_written > 0 ? double(s.payload_bytes_written) / double(s.bytes_written) : 1.0,
        static_cast<long long>(s.hits));
  }
}

void AsyncEngine::PublishLoad(const EngineStepStats& stats) {
  std::lock_guard<std::mutex> lock(mu_);
  load_.running = static_cast<int32_t>(engine_.scheduler().running().size());
  load_.waiting = static_cast<int32_t>(engine_.scheduler().waiting().size());
  load_.free_blocks = engine_.kv().num_free_blocks();
  ++load_.steps;
  load_.tokens_computed += stats.n_tokens;
  load_.preemptions += stats.n_preempted;
  if (stats.n_tokens > 0) {  // an idle step reports no totals
    load_.prefix_queries = stats.prefix_queries;
    load_.prefix_hits = stats.prefix_hits;
    load_.spec_drafts = stats.spec_drafts;
    load_.spec_draft_tokens = stats.spec_draft_tokens;
    load_.spec_accepted_tokens = stats.spec_accepted_tokens;
    load_.evicted_tokens = stats.evicted_tokens;
    load_.compactions = stats.compactions;
    load_.blocks_freed_by_compaction = stats.blocks_freed_by_compaction;
  }
}

}  // namespace kvs
