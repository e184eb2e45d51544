#include "api/token_dispatcher.h"

#include <utility>

namespace kvserve {

TokenDispatcher::TokenDispatcher(const kvs::Tokenizer& tokenizer,
                                 const std::vector<std::string>* tier_labels, Clock now)
    : tokenizer_(tokenizer),
      tier_labels_(tier_labels),
      now_(std::move(now)),
      thread_([this] { Loop(); }) {}

TokenDispatcher::~TokenDispatcher() {
  Drain();
}

kvs::TokenCallback TokenDispatcher::Bind(TokenCallback on_token) {
  auto stream = std::make_shared<Stream>();
  stream->on_token = std::move(on_token);
  return [this, stream = std::move(stream)](const kvs::TokenEvent& e) {
    urgent_ = urgent_ || !stream->started || e.finished;
    stream->started = true;
    kept_.push_back({stream, e});
  };
}

void TokenDispatcher::Flush() {
  if (kept_.empty() && !deferred_) return;
  const auto now = now_();
  const bool due = urgent_ || now - last_wake_ >= kMaxDeferral;
  if (kept_.empty() && !due) return;
  urgent_ = false;
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.empty()) {
      queue_.swap(kept_);
    } else {
      for (Item& item : kept_) queue_.push_back(std::move(item));
      kept_.clear();
    }
    // None while the thread is still delivering: it takes the queue when it is done.
    if (idle_ && !queue_.empty() && due) {
      wake = true;
      idle_ = false;
    }
    deferred_ = idle_ && !queue_.empty();
  }
  // The last hand-off: a wake-up, or a queue the busy thread takes when done.
  if (!deferred_) last_wake_ = now;
  if (wake) wake_.notify_one();
}

bool TokenDispatcher::idle() {
  std::lock_guard<std::mutex> lock(mu_);
  return idle_ && queue_.empty();
}

void TokenDispatcher::Drain() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void TokenDispatcher::Loop() {
  std::vector<Item> batch;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      while (queue_.empty() && !stopping_) {
        idle_ = true;
        wake_.wait(lock);
      }
      idle_ = false;
      if (queue_.empty()) return;  // stopping, and everything delivered
      batch.swap(queue_);
    }
    for (const Item& item : batch) Deliver(*item.stream, item.event);
    batch.clear();  // a finished request's callback is destroyed here, with its last event
  }
}

void TokenDispatcher::Deliver(Stream& stream, const kvs::TokenEvent& e) const {
  TokenEvent out;
  out.request = static_cast<uint64_t>(e.request);
  out.choice = e.choice;
  out.token = e.token;
  out.finished = e.finished;
  if (e.finished) out.finish_reason = kvs::FinishReasonName(e.reason);
  out.error = e.error;
  out.logprob = e.logprob;
  out.cached_tokens = e.cached_tokens;
  for (size_t i = 0; i < tier_labels_->size(); ++i) {
    if (e.tier_tokens[i] > 0) out.tier_tokens.push_back({(*tier_labels_)[i], e.tier_tokens[i]});
  }
  for (const kvs::TokenLogprob& alt : e.top_logprobs) {
    out.top_logprobs.push_back({alt.token, tokenizer_.TokenToPiece(alt.token, true), alt.logprob});
  }
  auto it = stream.detokenizers.try_emplace(e.choice, tokenizer_).first;
  if (e.token >= 0) out.text = it->second.Push(e.token);
  if (e.finished) out.text += it->second.Flush();
  if (stream.on_token) stream.on_token(out);
}

}  // namespace kvserve
