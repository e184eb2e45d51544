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
  for (const auto& t : e.tier_tokens) {
    auto it = std::find_if(tier_tokens_.begin(), tier_tokens_.end(),
                           [&](const auto& seen) { return seen.tier == t.tier; });
    if (it == tier_tokens_.end()) {
      tier_tokens_.push_back(t);
    } else {
      it->tokens = std::max(it->tokens, t.tokens);
    }
  }
  if (e.token >= 0) {
    if (ttft_s_ < 0) {
      ttft_s_ = std::chrono::duration<double>(now - start_).count();
      if (metrics_) metrics_->RecordTimeToFirstToken(ttft_s_);
    } else if (e.choice == 0 && metrics_) {
      metrics_->RecordInterTokenGap(std::chrono::duration<double>(now - last_token_).count());
    }
    if (e.choice == 0) last_token_ = now;
  }
  if (!c.done && (e.token >= 0 || !e.text.empty())) {
    std::string lp;
    std::vector<int32_t> ids;
    if (e.token >= 0) {
      ++c.tokens;
      if (request_.logprobs) RecordLogprobs(e, &c, &lp);
      if (request_.return_token_ids) {
        (request_.stream ? ids : c.token_ids).push_back(e.token);
      }
    }
    Emit(e.choice, e.text, e.finished, std::move(lp), std::move(ids));
  }
  if (e.finished) {
    if (e.finish_reason == "error") {
      error_ = true;
      error_message_ = e.error;
    }
    ++engine_ends_;
    if (engine_ends_ == static_cast<int32_t>(choices_.size())) {
      engine_done_ = true;
      if (on_engine_done_) on_engine_done_();
    }
    if (!c.done) FinishChoice(e.choice, e.finish_reason);
  }
  cv_.notify_all();
}

void CompletionCall::RecordLogprobs(const kvserve::TokenEvent& e, Choice* c,
                                    std::string* streamed) {
  const auto append = [](std::string* list, const std::string& item) {
    if (!list->empty()) *list += ",";
    *list += item;
  };
  if (request_.chat) {
    const std::string entry = ChatLogprobJson(e, e.text);
    if (request_.stream) {
      *streamed = "{\"content\":[" + entry + "]}";
    } else {
      append(&c->lp_content, entry);
    }
    return;
  }
  const std::string token = JsonString(e.text);
  const std::string value = JsonNumber(e.logprob);
  const std::string top = CompletionTopLogprobsJson(e);
  if (request_.stream) {
    const size_t offset = c->text.size() + c->pending.size();
    *streamed = "{\"tokens\":[" + token + "],\"token_logprobs\":[" + value +
                "],\"top_logprobs\":[" + top + "],\"text_offset\":[" + std::to_string(offset) +
                "]}";
    return;
  }
  append(&c->lp_tokens, token);
  append(&c->lp_values, value);
  append(&c->lp_top, top);
  append(&c->lp_offsets, std::to_string(c->lp_offset));
  c->lp_offset += static_cast<int64_t>(e.text.size());
}

void CompletionCall::Emit(int32_t index, const std::string& text, bool final, std::string logprobs,
                          std::vector<int32_t> token_ids) {
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
    if (request_.stream) {
      pieces_.push_back({index, out, "", std::move(logprobs), std::move(token_ids)});
    }
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
  // A token whose text is held back (a possible stop string) still sends its id now: the ids
  // are the tokens generated, in order, whatever the stop strings make of the text.
  if (request_.stream && (!out.empty() || !logprobs.empty() || !token_ids.empty())) {
    pieces_.push_back({index, out, "", std::move(logprobs), std::move(token_ids)});
  }
}

void CompletionCall::FinishChoice(int32_t index, const std::string& reason) {
  Choice& c = choices_[index];
  if (!c.pending.empty()) {
    c.text += c.pending;
    if (request_.stream) pieces_.push_back({index, c.pending, "", "", {}});
    c.pending.clear();
  }
  c.done = true;
  c.finish_reason = reason;
  ++n_done_;
  if (request_.stream) pieces_.push_back({index, "", reason, "", {}});
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
  // <tier>_tokens (extensions: disk_tokens, redis_tokens): of the cached ones, those each tier
  // loaded; every tier the build has is named, 0 where it loaded none or is not on.
  nlohmann::json details = {{"cached_tokens", cached_tokens_}};
  for (const std::string& tier : kvserve::TierNames()) {
    int32_t tokens = 0;
    for (const auto& t : tier_tokens_) {
      if (t.tier == tier) tokens = t.tokens;
    }
    details[tier + "_tokens"] = tokens;
  }
  return {{"prompt_tokens", prompt_tokens_},
          {"completion_tokens", completion},
          {"total_tokens", prompt_tokens_ + completion},
          {"prompt_tokens_details", std::move(details)}};
}

std::string CompletionCall::ChunkJson(const Piece& p) {
  std::string choice = "{\"index\":" + std::to_string(p.choice);
  if (request_.chat) {
    nlohmann::json delta = nlohmann::json::object();
    Choice& c = choices_[p.choice];
    if (!c.role_sent) {
      delta["role"] = "assistant";
      c.role_sent = true;
    }
    if (!p.text.empty() || p.finish_reason.empty()) delta["content"] = p.text;
    choice += ",\"delta\":" + Dump(delta);
  } else {
    choice += ",\"text\":" + JsonString(p.text);
  }
  choice += ",\"logprobs\":" + (p.logprobs.empty() ? std::string("null") : p.logprobs);
  if (request_.return_token_ids) choice += ",\"token_ids\":" + Dump(p.token_ids);
  choice += ",\"finish_reason\":" +
            (p.finish_reason.empty() ? std::string("null") : JsonString(p.finish_reason)) + "}";
  std::string chunk = "{\"id\":" + JsonString(id_) + ",\"object\":\"" +
                      (request_.chat ? "chat.completion.chunk" : "text_completion") +
                      "\",\"created\":" + std::to_string(created_) +
                      ",\"model\":" + JsonString(model_) + ",\"choices\":[" + choice + "]";
  if (request_.include_usage) chunk += ",\"usage\":null";
  return chunk + "}";
}

std::string CompletionCall::FinalJson() const {
  std::string choices;
  for (size_t i = 0; i < choices_.size(); ++i) {
    const Choice& c = choices_[i];
    if (i > 0) choices += ",";
    choices += "{\"index\":" + std::to_string(i) +
               ",\"finish_reason\":" + JsonString(c.finish_reason) + ",\"logprobs\":";
    if (!request_.logprobs) {
      choices += "null";
    } else if (request_.chat) {
      choices += "{\"content\":[" + c.lp_content + "]}";
    } else {
      choices += "{\"tokens\":[" + c.lp_tokens + "],\"token_logprobs\":[" + c.lp_values +
                 "],\"top_logprobs\":[" + c.lp_top + "],\"text_offset\":[" + c.lp_offsets + "]}";
    }
    if (request_.return_token_ids) choices += ",\"token_ids\":" + Dump(c.token_ids);
    if (request_.chat) {
      choices +=
          ",\"message\":" + Dump(nlohmann::json{{"role", "assistant"}, {"content", c.text}}) + "}";
    } else {
      choices += ",\"text\":" + JsonString(c.text) + "}";
    }
  }
  return "{\"id\":" + JsonString(id_) + ",\"object\":\"" +
         (request_.chat ? "chat.completion" : "text_completion") +
         "\",\"created\":" + std::to_string(created_) + ",\"model\":" + JsonString(model_) +
         ",\"choices\":[" + choices + "],\"usage\":" + Dump(Usage()) + "}";
}

void CompletionCall::RecordMetrics(bool ok) {
  if (!metrics_) return;
  int64_t completion = 0;
  for (const Choice& c : choices_) completion += c.tokens;
  metrics_->RecordRequest(prompt_tokens_, completion,
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

void CompletionCall::OnEngineDone(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(mu_);
  on_engine_done_ = std::move(fn);
  if (engine_done_ && on_engine_done_) on_engine_done_();
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
