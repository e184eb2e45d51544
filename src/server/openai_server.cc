#include "server/openai_server.h"

#include <malloc.h>
#include <strings.h>

#include <chrono>
#include <semaphore>

#include "core/log.h"
#include "server/completion_call.h"
#include "server/openai_api.h"

namespace kvs::server {

void SendError(http::Response& res, const ApiError& e) {
  res.status = e.status;
  res.content_type = "application/json";
  res.body = Dump(ErrorJson(e));
  res.stream = nullptr;
}

namespace {

std::string FileStem(const std::string& path) {
  std::string name = path.substr(path.find_last_of('/') + 1);
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".gguf") == 0)
    name.resize(name.size() - 5);
  return name;
}

// Work a request's logprobs may cost: entries of n x max_tokens x (top_logprobs + 1). A
// streamed response keeps none of them; a non-streamed one holds its JSON text until the end.
constexpr int64_t kMaxLogprobEntriesStreamed = int64_t{1} << 22;
constexpr int64_t kMaxLogprobEntries = int64_t{1} << 18;
// Bodies above this are parsed and tokenized two at a time (Server::heavy_).
constexpr size_t kLargeBodyBytes = size_t{1} << 20;

// A large body's turn at parsing and tokenizing: holds one of Server::heavy_'s seats (none for
// a small body) and, once done, gives it back with the memory the parse took.
class LargeBodyTurn {
 public:
  explicit LargeBodyTurn(std::counting_semaphore<>* seats) : seats_(seats) {
    if (seats_) seats_->acquire();
  }
  ~LargeBodyTurn() {
    if (!seats_) return;
    seats_->release();
    malloc_trim(0);
  }
  LargeBodyTurn(const LargeBodyTurn&) = delete;
  LargeBodyTurn& operator=(const LargeBodyTurn&) = delete;

 private:
  std::counting_semaphore<>* seats_;
};

// The request against this server: its model, its n against -np, its kv_budget against the
// eviction guard.
std::optional<ApiError> CheckRequestFits(const CompletionRequest& request,
                                         const std::string& model_id,
                                         const kvserve::EngineOptions& eo) {
  if (!request.model.empty() && request.model != model_id) {
    return ApiError{404, "invalid_request_error",
                    "The model " + Quote(request.model) + " does not exist; this server has '" +
                        model_id + "'.",
                    "model", "model_not_found"};
  }
  if (request.gen.n > eo.n_parallel) {
    return ApiError{400,
                    "invalid_request_error",
                    "'n' is " + std::to_string(request.gen.n) + "; this server decodes at most " +
                        std::to_string(eo.n_parallel) + " sequences at once (-np)",
                    "n",
                    {}};
  }
  // The request's budget against this server's guard: the first --kv-sink and the last
  // --kv-window positions are never evicted, so a smaller budget could never be kept.
  if (!request.gen.kv_budget.empty()) {
    std::string canonical, error;
    if (!kvserve::CheckKvBudget(request.gen.kv_budget, eo.kv_sink, eo.kv_window, &canonical,
                                &error)) {
      return ApiError{400,
                      "invalid_request_error",
                      "'kv_budget' is " + request.gen.kv_budget +
                          "; this server never evicts the first " + std::to_string(eo.kv_sink) +
                          " nor the last " + std::to_string(eo.kv_window) +
                          " positions of a sequence, so a budget must be at "
                          "least " +
                          std::to_string(eo.kv_sink + eo.kv_window),
                      "kv_budget",
                      {}};
    }
  }
  return std::nullopt;
}

// The tokenized prompt against the context, and the log-probabilities the request may cost.
std::optional<ApiError> CheckPromptFits(const CompletionRequest& request, bool chat,
                                        size_t prompt_tokens, int32_t n_ctx) {
  if (static_cast<int64_t>(prompt_tokens) >= n_ctx) {
    return ApiError{400, "invalid_request_error",
                    "This model's maximum context length is " + std::to_string(n_ctx) +
                        " tokens; the prompt has " + std::to_string(prompt_tokens) + ".",
                    chat ? "messages" : "prompt", "context_length_exceeded"};
  }
  if (request.gen.logprobs >= 0) {
    const int64_t tokens = request.gen.max_tokens > 0 ? request.gen.max_tokens
                                                      : n_ctx - static_cast<int64_t>(prompt_tokens);
    const int64_t entries = int64_t{request.gen.n} * tokens * (request.gen.logprobs + 1);
    const int64_t cap = request.stream ? kMaxLogprobEntriesStreamed : kMaxLogprobEntries;
    if (entries > cap) {
      return ApiError{400,
                      "invalid_request_error",
                      "n x max_tokens x (top_logprobs + 1) is " + std::to_string(entries) +
                          " log-probabilities, more than the " + std::to_string(cap) +
                          (request.stream ? " a streamed" : " a non-streamed") +
                          " request may ask for; lower one of them" +
                          (request.stream ? "" : ", or stream the response"),
                      chat ? "top_logprobs" : "logprobs",
                      {}};
    }
  }
  return std::nullopt;
}

// The engine's refusal of a request the checks above let through, naming the parameter where
// the message shows which.
ApiError SubmitRefusal(const std::string& error) {
  const bool kv = error.find("KV memory") != std::string::npos;
  const bool budget = error.rfind("kv_budget", 0) == 0;  // checked on arrival; named if it slips by
  return ApiError{400,
                  "invalid_request_error",
                  error,
                  budget ? "kv_budget" : (kv ? "max_tokens" : std::string()),
                  {}};
}

// Pumps the call's response to the client until it ends or the client is gone.
void WriteResponse(CompletionCall& call, http::BodyWriter& writer,
                   std::chrono::milliseconds grace) {
  // Once the engine is done, the rest must reach the client within --timeout: a client that
  // reads too slowly to keep up must not hold its seat and its thread for ever.
  call.OnEngineDone(
      [&writer, grace] { writer.SetDeadline(std::chrono::steady_clock::now() + grace); });
  const auto sink = [&writer](const std::string& s) { return writer.Write(s); };
  bool done = false;
  while (!done && call.Pump(sink, &done)) {
  }
}

}  // namespace

Server::Server(ServerOptions options)
    : options_(std::move(options)), kv_state_(kKvStateInterval, [this] {
        auto reply = std::make_shared<KvStateReply>();
        if (!engine_->KvState(&reply->state, &reply->error) && reply->error.empty()) {
          reply->error = "the KV state could not be read";
        }
        return std::shared_ptr<const KvStateReply>(std::move(reply));
      }) {
  model_id_ = options_.alias.empty() ? FileStem(options_.model_path) : options_.alias;
}

Server::~Server() {
  Stop();
}

// Whether the request carries the API key: "Bearer" in any case, the key compared in time that
// does not depend on where it first differs.
bool Server::Authorized(const http::Request& req) const {
  if (options_.api_key.empty()) return true;
  const std::string header = req.Get("authorization");
  if (header.size() < 7 || strncasecmp(header.c_str(), "bearer ", 7) != 0) return false;
  size_t start = 7;
  while (start < header.size() && header[start] == ' ') ++start;
  const std::string_view key = std::string_view(header).substr(start);
  const std::string& want = options_.api_key;
  unsigned char diff = key.size() == want.size() ? 0 : 1;
  for (size_t i = 0; i < want.size(); ++i) {
    diff |= static_cast<unsigned char>(want[i] ^ (i < key.size() ? key[i] : 0));
  }
  return diff == 0;
}

namespace {

// 405 naming the methods the path takes, with RFC 9110's Allow header.
http::Response MethodNotAllowed(const http::Request& req, std::string_view allowed) {
  http::Response res;
  SendError(res,
            ApiError{405,
                     "invalid_request_error",
                     req.path + " takes " + std::string(allowed) + ", not " + Quote(req.method),
                     {},
                     "method_not_allowed"});
  res.headers.push_back({"Allow", std::string(allowed)});
  return res;
}

}  // namespace

// The refusals that need only the head (key, path, method): the HTTP layer calls this before
// reading a body, so that nobody without the key can make the server receive one.
std::optional<http::Response> Server::Admit(const http::Request& req) const {
  http::Response res;
  if ((req.path.rfind("/v1/", 0) == 0 || req.path == "/reset_prefix_cache") && !Authorized(req)) {
    SendError(res, ApiError{401,
                            "invalid_request_error",
                            req.Find("authorization") ? "Incorrect API key provided."
                                                      : "Missing API key: send "
                                                        "'Authorization: Bearer KEY'.",
                            {},
                            "invalid_api_key"});
    res.headers.push_back({"WWW-Authenticate", "Bearer"});  // RFC 9110: a 401 names its scheme
    return res;
  }
  struct Route {
    const char* method;
    const char* path;
  };
  static constexpr Route kRoutes[] = {{"GET", "/health"},
                                      {"GET", "/metrics"},
                                      {"GET", "/v1/models"},
                                      {"POST", "/v1/completions"},
                                      {"POST", "/v1/chat/completions"},
                                      {"POST", "/reset_prefix_cache"},
                                      {"GET", kKvStatePath},
                                      {"GET", kDashboardPath}};
  const Route* route = nullptr;
  for (const Route& r : kRoutes) {
    if (req.path == r.path && (req.path != kDashboardPath || options_.dashboard)) route = &r;
  }
  if (IsKvDocumentPath(req.path) || req.path == kKvLookupPath) {
    // GET and POST on the collection and the lookup, GET and DELETE on a document.
    const bool collection = req.path == kKvDocumentsPath || req.path == kKvLookupPath;
    const char* allowed = collection ? "GET, HEAD, POST" : "GET, HEAD, DELETE";
    const bool ok = req.method == "GET" || req.method == "HEAD" ||
                    req.method == (collection ? "POST" : "DELETE");
    if (ok) return std::nullopt;
    return MethodNotAllowed(req, allowed);
  }
  if (!route) {
    SendError(res, ApiError{404,
                            "invalid_request_error",
                            "Unknown path: " + req.method + " " + Quote(req.path),
                            {},
                            "not_found"});
    return res;
  }
  const bool get_or_head = std::string_view(route->method) == "GET" && req.method == "HEAD";
  if (req.method != route->method && !get_or_head) {
    return MethodNotAllowed(req,
                            std::string_view(route->method) == "GET" ? "GET, HEAD" : route->method);
  }
  return std::nullopt;
}

// Admit has already passed the request's head (the HTTP layer's head filter): the key is good
// and the path and method are among the routes.
void Server::Handle(http::Request& req, http::Response& res) {
  if (req.path == "/health") {
    if (ready_ && !stopping_) {
      res.body = R"({"status":"ok"})";
    } else {
      res.status = 503;
      res.body = stopping_ ? R"({"status":"stopping"})" : R"({"status":"loading"})";
    }
    return;
  }
  if (req.path == kDashboardPath) {
    // The page holds no data: it asks /v1/kv/state (with the API key, when there is one).
    res.content_type = "text/html; charset=utf-8";
    res.body = std::string(DashboardPage());
    // It keeps the API key for the tab: no framing by other sites, no sniffing, no caching.
    res.headers.push_back({"X-Frame-Options", "DENY"});
    res.headers.push_back({"Content-Security-Policy", "frame-ancestors 'none'"});
    res.headers.push_back({"X-Content-Type-Options", "nosniff"});
    res.headers.push_back({"Cache-Control", "no-store"});
    return;
  }
  if (req.path == "/metrics") {
    const kvserve::EngineStats stats = ready_ ? engine_->stats() : kvserve::EngineStats{};
    res.content_type = "text/plain; version=0.0.4";
    res.body = metrics_.Render(stats, model_id_, http_->stats());
    return;
  }
  if (!ready_ || stopping_) {
    return SendError(res,
                     ApiError{503,
                              "server_error",
                              stopping_ ? "The server is shutting down." : "The model is loading.",
                              {},
                              {}});
  }
  if (req.path == "/v1/models") return Models(res);
  if (IsKvDocumentPath(req.path)) return KvDocuments(req, res);
  if (req.path == kKvLookupPath) return KvLookup(req, res);
  if (req.path == kKvStatePath) return KvState(res);
  if (req.path == "/reset_prefix_cache") return ResetPrefixCache(res);
  Completion(req, res, /*chat=*/req.path == "/v1/chat/completions");
}

std::optional<ApiError> Server::PromptTokens(const CompletionRequest& request, bool chat,
                                             const std::string& param,
                                             std::vector<int32_t>* out) const {
  if (chat) {
    const RenderedChat rendered = RenderChat(chat_format_, request.messages);
    *out = model_->Tokenize(rendered.text, rendered.add_bos);
  } else if (!request.prompt_ids.empty()) {
    for (int32_t t : request.prompt_ids) {
      if (t >= model_->n_vocab()) {
        return ApiError{400,
                        "invalid_request_error",
                        "token id " + std::to_string(t) + " is outside the vocabulary (0.." +
                            std::to_string(model_->n_vocab() - 1) + ")",
                        param,
                        {}};
      }
    }
    *out = request.prompt_ids;
  } else {
    *out = model_->Tokenize(request.prompt_text, /*add_special=*/true);
  }
  return std::nullopt;
}

void Server::Models(http::Response& res) const {
  const nlohmann::json model = {{"id", model_id_},
                                {"object", "model"},
                                {"created", 0},
                                {"owned_by", "kvserve"},
                                {"meta",
                                 {{"n_vocab", model_->n_vocab()},
                                  {"n_ctx", engine_->options().n_ctx},
                                  {"n_ctx_train", model_->n_ctx_train()},
                                  {"chat_template", ChatFormatName(chat_format_)}}}};
  res.body = Dump(nlohmann::json{{"object", "list"}, {"data", {model}}});
}

void Server::Completion(const http::Request& req, http::Response& res, bool chat) {
  // A large body costs tens of times its size while it is parsed and tokenized: only a few are
  // at once, and the memory goes back to the system afterwards.
  const LargeBodyTurn heavy(req.body.size() > kLargeBodyBytes ? &heavy_ : nullptr);
  nlohmann::json body;
  if (auto err = ParseJsonBody(req.body, &body)) return SendError(res, *err);
  CompletionRequest request;
  if (auto err = ParseCompletionRequest(body, chat, &request)) return SendError(res, *err);
  body = nullptr;  // the parsed request holds what is needed
  const kvserve::EngineOptions& eo = engine_->options();
  if (auto err = CheckRequestFits(request, model_id_, eo)) return SendError(res, *err);
  std::vector<int32_t> prompt;
  if (auto err = PromptTokens(request, chat, "prompt", &prompt)) return SendError(res, *err);
  if (auto err = CheckPromptFits(request, chat, prompt.size(), eo.n_ctx)) {
    return SendError(res, *err);
  }
  const int64_t limit = eo.n_parallel + options_.max_queue;
  if (in_flight_.fetch_add(1) >= limit) {
    in_flight_.fetch_sub(1);
    return SendError(res, ApiError{503,
                                   "server_error",
                                   "The server is overloaded (" + std::to_string(limit) +
                                       " requests in flight); retry later.",
                                   {},
                                   "overloaded"});
  }
  const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id_++);
  auto call = std::make_shared<CompletionCall>(request, id, model_id_,
                                               static_cast<int64_t>(prompt.size()), &metrics_);
  std::string error;
  const uint64_t rid = engine_->Submit(
      std::move(prompt), request.gen, [call](const kvserve::TokenEvent& e) { call->OnEvent(e); },
      &error);
  if (rid == 0) {
    in_flight_.fetch_sub(1);
    return SendError(res, SubmitRefusal(error));
  }
  {
    std::lock_guard lock(response_ids_mu_);
    response_ids_[rid] = id;
  }
  kvserve::Engine* engine = engine_.get();
  call->Attach(rid, [engine](uint64_t r) { engine->Cancel(r); });
  res.content_type = request.stream ? "text/event-stream" : "application/json";
  res.stream = [call, this, rid](http::BodyWriter& writer) {
    // Ends the request in the engine however the response ends (no-op when it completed).
    struct Release {
      CompletionCall* call;
      Server* server;
      uint64_t rid;
      ~Release() {
        call->OnEngineDone(nullptr);
        call->Abandon();
        {
          std::lock_guard lock(server->response_ids_mu_);
          server->response_ids_.erase(rid);
        }
        server->in_flight_.fetch_sub(1);
      }
    } release{call.get(), this, rid};
    WriteResponse(*call, writer, options_.write_timeout);
  };
}

Expected<int> Server::Listen() {
  http::HttpServerOptions o;
  o.host = options_.host;
  o.port = options_.port;
  o.limits.max_body_bytes = options_.max_body_bytes;
  // Every request in flight holds a worker while it streams; the rest answer the quick ones
  // (health, metrics, refusals) however many completions run.
  o.worker_threads = std::min(1024, options_.engine.n_parallel + options_.max_queue + 8);
  o.max_connections = options_.max_connections;
  o.header_timeout = options_.header_timeout;
  o.body_timeout = options_.body_timeout;
  o.idle_timeout = options_.idle_timeout;
  o.write_timeout = options_.write_timeout;
  o.socket_send_buffer = options_.socket_send_buffer;
  http_ = std::make_unique<http::HttpServer>(
      o, [this](http::Request& req, http::Response& res) { Handle(req, res); },
      [](int status, const std::string& message) {
        http::Response res;
        SendError(
            res,
            ApiError{
                status, status >= 500 ? "server_error" : "invalid_request_error", message, {}, {}});
        return res;
      },
      [this](const http::Request& req) { return Admit(req); });
  Expected<int> port = http_->Listen();
  if (!port.ok()) {
    http_.reset();
    return port;
  }
  listening_ = true;
  return port;
}

Status Server::Load() {
  std::string error;
  model_ = kvserve::Model::Load(options_.model_path, options_.model_options, &error);
  if (!model_) return Status::Error(error);
  if (!options_.chat_template.empty()) {
    KVS_ASSIGN_OR_RETURN(chat_format_, ChatFormatFromName(options_.chat_template));
  } else {
    chat_format_ = DetectChatFormat(model_->ChatTemplate());
  }
  kvserve::EngineOptions eo = options_.engine;
  if (eo.n_ctx == 0) eo.n_ctx = model_->n_ctx_train();
  engine_ = kvserve::Engine::Start(model_, eo, &error);
  if (!engine_) return Status::Error(error);
  // Requests without max_tokens may grow to -c: one such sequence must fit the pool (in every
  // KV cache group of the model).
  const kvserve::EngineStats s = engine_->stats();
  const int64_t need = model_->kv_blocks_per_sequence(eo.n_ctx, s.block_size, eo.max_batch_tokens);
  if (need > s.kv_blocks_total) {
    engine_.reset();
    return Status::Error(StrFormat(
        "--kv-memory holds %lld blocks of %d positions, fewer than one full context needs "
        "(-c %d: %lld blocks); raise --kv-memory or lower -c",
        static_cast<long long>(s.kv_blocks_total), s.block_size, eo.n_ctx,
        static_cast<long long>(need)));
  }
  ready_ = true;
  return Status::Ok();
}

void Server::Stop() {
  std::lock_guard<std::mutex> lock(stop_mu_);
  stopping_ = true;  // new requests get 503 from here on
  // Cancelling what runs lets every handler finish its response ([DONE]) within the grace;
  // the HTTP layer then cuts whatever still writes (a client that does not read), joins its
  // threads, and nothing refers to the engine any more.
  if (engine_) engine_->CancelAll();
  if (http_) http_->Stop(options_.shutdown_grace);
  listening_ = false;
  engine_.reset();
}

}  // namespace kvs::server
