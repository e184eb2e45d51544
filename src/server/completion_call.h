// One /v1/completions or /v1/chat/completions call in flight: collects the engine's token
// events (on the API's token thread, kvserve::Engine's callbacks: never on the engine's loop),
// applies stop strings per choice, records the token metrics, and turns them into the
// response (on the HTTP thread): SSE chunks when streaming, one JSON body otherwise. The HTTP
// side waits at most a second at a time and writes a keep-alive (an SSE comment, or whitespace
// before the JSON) when nothing came, so a client that went away is noticed and its request
// cancelled.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvserve/kvserve.h"
#include "server/metrics.h"
#include "server/openai_api.h"

namespace kvs::server {

class CompletionCall {
 public:
  using Clock = std::chrono::steady_clock;
  CompletionCall(const CompletionRequest& request, std::string id, std::string model,
                 int64_t prompt_tokens, Metrics* metrics);

  // Engine side: one token event (the API's token thread; in order, one at a time). A stop
  // string ends the choice here, cut exactly before the stop, and cancels the request; tokens the
  // engine produced after it are dropped and not counted.
  void OnEvent(const kvserve::TokenEvent& e);
  // Set after Submit; cancel(request) ends it in the engine.
  void Attach(uint64_t request, std::function<void(uint64_t)> cancel);

  // HTTP side: writes what is ready to `write`; returns false when the client is gone (the
  // request is then cancelled) and sets *done when the response is complete.
  bool Pump(const std::function<bool(const std::string&)>& write, bool* done);
  // The client went away before the end: cancel the request if it still runs.
  void Abandon();
  // Calls fn (on the API's token thread, or now) once the engine has sent every choice's end;
  // nullptr forgets it.
  void OnEngineDone(std::function<void()> fn);

 private:
  struct Choice {
    std::string text;     // emitted so far (non-streaming: the whole answer)
    std::string pending;  // held back: might be the start of a stop string
    int32_t tokens = 0;
    bool done = false;
    bool role_sent = false;
    std::string finish_reason;
    // A non-streamed response's logprobs as JSON text, elements comma-separated: chat entries,
    // or the four arrays of a completion. A streamed response keeps none.
    std::string lp_content;
    std::string lp_tokens, lp_values, lp_top, lp_offsets;
    int64_t lp_offset = 0;
    std::vector<int32_t> token_ids;  // return_token_ids, not streamed: every generated id
  };
  struct Piece {  // streaming: text for a client, in order
    int32_t choice;
    std::string text;
    std::string finish_reason;       // non-empty: the choice ends with this piece
    std::string logprobs;            // this piece's logprobs as JSON text ("": null)
    std::vector<int32_t> token_ids;  // return_token_ids: the ids generated with this piece
  };

  // Under mu_: adds text to a choice, holding back a possible stop-string start.
  void Emit(int32_t index, const std::string& text, bool final, std::string logprobs,
            std::vector<int32_t> token_ids);
  void RecordLogprobs(const kvserve::TokenEvent& e, Choice* c, std::string* streamed);
  void FinishChoice(int32_t index, const std::string& reason);
  std::string ChunkJson(const Piece& p);
  nlohmann::json Usage() const;
  std::string FinalJson() const;
  void RecordMetrics(bool ok);

  const CompletionRequest request_;
  const std::string id_, model_;
  const int64_t prompt_tokens_;
  const int64_t created_;
  Metrics* metrics_;
  const Clock::time_point start_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Choice> choices_;
  std::deque<Piece> pieces_;
  int32_t n_done_ = 0;
  int32_t engine_ends_ = 0;
  bool engine_done_ = false;  // the engine has sent every choice's end
  bool error_ = false;
  std::string error_message_;
  uint64_t request_id_ = 0;
  std::function<void(uint64_t)> cancel_;
  bool cancel_sent_ = false;
  double ttft_s_ = -1;
  int32_t cached_tokens_ = 0;
  // Of those, the ones each tier loaded (the most any event said), by the tier's name.
  std::vector<kvserve::TokenEvent::TierTokens> tier_tokens_;
  Clock::time_point last_token_;
  bool finished_ = false;  // response written
  std::function<void()> on_engine_done_;
};

}  // namespace kvs::server
