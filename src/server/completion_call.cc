#include "server/completion_call.h"

#include <algorithm>
#include <ctime>

namespace kvs::server {

CompletionCall::CompletionCall(const CompletionRequest& request, std::string id, std::string model,
                               int64_t prompt_tokens, Metrics* metrics)
    : request_(request),
      id_(std::move(id)),
      model_(std::move(model)),
      prompt_tokens_(prompt_tokens),
      created_(static_cast<int64_t>(std::time(nullptr))),
      metrics_(metrics),
      start_(Clock::now()),
      choices_(static_cast<size_t>(request.gen.n)),
      last_token_(start_) {}

void CompletionCall::Attach(uint64_t request, std::function<void(uint64_t)> cancel) {
  std::lock_guard<std::mutex> lock(mu_);
  request_id_ = request;
  cancel_ = std::move(cancel);
  if (n_done_ == static_cast<int32_t>(choices_.size()) && !engine_done_ && !cancel_sent_) {
    cancel_sent_ = true;
    cancel_(request_id_);
  }
}

void CompletionCall::OnEvent(const kvserve::TokenEvent& e) {
  std::lock_guard<std::mutex> lock(mu_);
  if (e.choice < 0 || e.choice >= static_cast<int32_t>(choices_.size())) return;
  Choice& c = choices_[e.choice];
  const auto now = Clock::now();
  cached_tokens_ = std::max(cached_tokens_, e.cached_tokens);
  if (e.token >= 0) {
    if (ttft_s_ < 0) {
      ttft_s_ = std::chrono::duration<double>(now - start_).count();
    } else if (e.choice == 0 && metrics_) {
      metrics_->RecordInterTokenGap(std::chrono::duration<double>(now - last_token_).count());
    }
    if (e.choice == 0) last_token_ = now;
  }
  if (!c.done && (e.token >= 0 || !e.text.empty())) {
    nlohmann::json lp = nullptr;
    if (e.token >= 0) {
      ++c.tokens;
      if (request_.logprobs) {
        nlohmann::json top = nlohmann::json::object();
        for (const auto& alt : e.top_logprobs) top[alt.text] = alt.logprob;
        c.lp_tokens.push_back(e.text);
        c.lp_values.push_back(e.logprob);
        c.lp_top.push_back(top);
        if (request_.chat) {
          const nlohmann::json entry = ChatLogprobEntry(e, e.text);
          c.logprobs.push_back(entry);
          lp = {{"content", nlohmann::json::array({entry})}};
        } else {
          lp = {{"tokens", {e.text}},
                {"token_logprobs", {e.logprob}},
                {"top_logprobs", {top}},
                {"text_offset", {static_cast<int64_t>(c.text.size() + c.pending.size())}}};
        }
      }
    }
    Emit(e.choice, e.text, e.finished, lp);
  }
  if (e.finished) {
    if (e.finish_reason == "error") {
      error_ = true;
      error_message_ = e.error;
    }
    ++engine_ends_;
    if (engine_ends_ == static_cast<int32_t>(choices_.size())) engine_done_ = true;
    if (!c.done) FinishChoice(e.choice, e.finish_reason);
  }
  cv_.notify_all();
}

void CompletionCall::Emit(int32_t index, const std::string& text, bool final,
                          nlohmann::json logprobs) {
  Choice& c = choices_[index];
  c.pending += text;
  std::string out;
  const std::vector<std::string>& stops = request_.stop;
  size_t stop_at = std::string::npos;
  for (const std::string& s : stops) stop_at = std::min(stop_at, c.pending.find(s));
  if (stop_at != std::string::npos) {
    out = c.pending.substr(0, stop_at);
    c.pending.clear();
    c.text += out;
    pieces_.push_back({index, out, "", logprobs});
    FinishChoice(index, "stop");
    return;
  }
  size_t hold = 0;
  if (!final) {
    // The longest tail of pending that starts some stop string: it may complete later.
    for (const std::string& s : stops) {
      for (size_t k = std::min(s.size() - 1, c.pending.size()); k > hold; --k) {
        if (c.pending.compare(c.pending.size() - k, k, s, 0, k) == 0) {
          hold = k;
          break;
        }
      }
    }
  }
  out = c.pending.substr(0, c.pending.size() - hold);
  c.pending.erase(0, c.pending.size() - hold);
  c.text += out;
  if (!out.empty() || !logprobs.is_null()) pieces_.push_back({index, out, "", logprobs});
}

void CompletionCall::FinishChoice(int32_t index, const std::string& reason) {
  Choice& c = choices_[index];
  if (!c.pending.empty()) {
    c.text += c.pending;
    pieces_.push_back({index, c.pending, "", nullptr});
    c.pending.clear();
  }
  c.done = true;
  c.finish_reason = reason;
  ++n_done_;
  pieces_.push_back({index, "", reason, nullptr});
  // Every choice is over (stop strings end a choice before the engine does): free the blocks.
  if (n_done_ == static_cast<int32_t>(choices_.size()) && !engine_done_ && cancel_ &&
      !cancel_sent_) {
    cancel_sent_ = true;
    cancel_(request_id_);
  }
}

nlohmann::json CompletionCall::Usage() const {
  int64_t completion = 0;
  for (const Choice& c : choices_) completion += c.tokens;
  return {{"prompt_tokens", prompt_tokens_},
          {"completion_tokens", completion},
          {"total_tokens", prompt_tokens_ + completion},
          {"prompt_tokens_details", {{"cached_tokens", cached_tokens_}}}};
}

std::string CompletionCall::ChunkJson(const Piece& p) {
  nlohmann::json choice = {{"index", p.choice}};
  choice["logprobs"] = p.logprobs;
  choice["finish_reason"] =
      p.finish_reason.empty() ? nlohmann::json(nullptr) : nlohmann::json(p.finish_reason);
  if (request_.chat) {
    nlohmann::json delta = nlohmann::json::object();
    Choice& c = choices_[p.choice];
    if (!c.role_sent) {
      delta["role"] = "assistant";
      c.role_sent = true;
    }
    if (!p.text.empty() || p.finish_reason.empty()) delta["content"] = p.text;
    choice["delta"] = delta;
  } else {
    choice["text"] = p.text;
  }
  nlohmann::json chunk = {{"id", id_},
                          {"object", request_.chat ? "chat.completion.chunk" : "text_completion"},
                          {"created", created_},
                          {"model", model_},
                          {"choices", {choice}}};
  if (request_.include_usage) chunk["usage"] = nullptr;
  return Dump(chunk);
}

std::string CompletionCall::FinalJson() const {
  nlohmann::json choices = nlohmann::json::array();
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    nlohmann::json choice = {{"index", i}, {"finish_reason", c.finish_reason}};
    nlohmann::json lp = nullptr;
    if (request_.logprobs) {
      if (request_.chat) {
        lp = {{"content", c.logprobs}};
      } else {
        std::vector<int64_t> offsets;
        int64_t off = 0;
        for (const std::string& t : c.lp_tokens) {
          offsets.push_back(off);
          off += static_cast<int64_t>(t.size());
        }
        lp = {{"tokens", c.lp_tokens},
              {"token_logprobs", c.lp_values},
              {"top_logprobs", c.lp_top},
              {"text_offset", offsets}};
      }
    }
    choice["logprobs"] = lp;
    if (request_.chat) {
      choice["message"] = {{"role", "assistant"}, {"content", c.text}};
    } else {
      choice["text"] = c.text;
    }
    choices.push_back(choice);
  }
  nlohmann::json body = {
      {"id", id_},           {"object", request_.chat ? "chat.completion" : "text_completion"},
      {"created", created_}, {"model", model_},
      {"choices", choices},  {"usage", Usage()}};
  return Dump(body);
}

void CompletionCall::RecordMetrics(bool ok) {
  if (!metrics_) return;
  int64_t completion = 0;
  for (const Choice& c : choices_) completion += c.tokens;
  metrics_->RecordRequest(prompt_tokens_, completion, ttft_s_,
                          std::chrono::duration<double>(Clock::now() - start_).count(), ok);
}

bool CompletionCall::Pump(const std::function<bool(const std::string&)>& write, bool* done) {
  std::vector<std::string> out;
  {
    std::unique_lock<std::mutex> lock(mu_);
    const auto all_done = [&] { return n_done_ == static_cast<int32_t>(choices_.size()); };
    cv_.wait_for(lock, std::chrono::seconds(1),
                 [&] { return (request_.stream && !pieces_.empty()) || all_done(); });
    if (request_.stream) {
      while (!pieces_.empty()) {
        out.push_back("data: " + ChunkJson(pieces_.front()) + "\n\n");
        pieces_.pop_front();
      }
      if (all_done()) {
        if (error_) {
          ApiError err{500, "server_error", error_message_, {}, {}};
          out.push_back("data: " + Dump(ErrorJson(err)) + "\n\n");
        }
        if (request_.include_usage) {
          nlohmann::json chunk = {
              {"id", id_},
              {"object", request_.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created_},
              {"model", model_},
              {"choices", nlohmann::json::array()},
              {"usage", Usage()}};
          out.push_back("data: " + Dump(chunk) + "\n\n");
        }
        out.push_back("data: [DONE]\n\n");
        finished_ = true;
      }
      if (out.empty()) out.push_back(": keep-alive\n\n");
    } else {
      pieces_.clear();  // the text is kept per choice
      if (all_done()) {
        if (error_) {
          out.push_back(Dump(ErrorJson(ApiError{500, "server_error", error_message_, {}, {}})));
        } else {
          out.push_back(FinalJson());
        }
        finished_ = true;
      } else {
        out.push_back(" ");  // whitespace before a JSON value is still the same JSON
      }
    }
    if (finished_) RecordMetrics(!error_);
  }
  for (const std::string& s : out) {
    if (!write(s)) {
      Abandon();
      return false;
    }
  }
  *done = finished_;
  return true;
}

void CompletionCall::Abandon() {
  std::lock_guard<std::mutex> lock(mu_);
  if (cancel_ && !cancel_sent_ && !engine_done_) {
    cancel_sent_ = true;
    cancel_(request_id_);
  }
  if (!finished_) {
    finished_ = true;
    RecordMetrics(false);
  }
}

}  // namespace kvs::server
