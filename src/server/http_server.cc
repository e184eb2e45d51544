#include "server/http_server.h"

#include <httplib.h>

#include <chrono>

#include "core/log.h"
#include "server/completion_call.h"
#include "server/openai_api.h"

namespace kvs::server {
namespace {

void SendError(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(Dump(ErrorJson(e)), "application/json");
}

std::string FileStem(const std::string& path) {
  std::string name = path.substr(path.find_last_of('/') + 1);
  if (name.size() > 5 && name.compare(name.size() - 5, 5, ".gguf") == 0)
    name.resize(name.size() - 5);
  return name;
}

}  // namespace

Server::Server(ServerOptions options) : options_(std::move(options)) {
  model_id_ = options_.alias.empty() ? FileStem(options_.model_path) : options_.alias;
}

Server::~Server() {
  Stop();
}

bool Server::Authorized(const httplib::Request& req, httplib::Response& res) const {
  if (options_.api_key.empty()) return true;
  if (req.get_header_value("Authorization") == "Bearer " + options_.api_key) return true;
  SendError(res, ApiError{401,
                          "invalid_request_error",
                          req.has_header("Authorization") ? "Incorrect API key provided."
                                                          : "Missing API key: send "
                                                            "'Authorization: Bearer KEY'.",
                          {},
                          "invalid_api_key"});
  return false;
}

void Server::Routes() {
  httplib::Server& s = *http_;
  s.set_payload_max_length(options_.max_body_bytes);
  // A handler thread is held by every connection: idle or slow ones must not keep it long.
  s.set_keep_alive_timeout(5);
  s.set_keep_alive_max_count(100);
  s.set_read_timeout(30, 0);
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.path.rfind("/v1/", 0) == 0 && !Authorized(req, res)) {
      return httplib::Server::HandlerResponse::Handled;
    }
    if (req.path != "/health" && req.path != "/metrics" && (!ready_ || stopping_)) {
      SendError(res, ApiError{503,
                              "server_error",
                              stopping_ ? "The server is shutting down." : "The model is loading.",
                              {},
                              {}});
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    ApiError e{res.status, "invalid_request_error", "", {}, {}};
    if (res.status == 404) {
      e.message = "Unknown path: " + req.method + " " + req.path;
      e.code = "not_found";
    } else if (res.status == 413) {
      e.message = "The request body is too large.";
    } else {
      e.message = "HTTP error " + std::to_string(res.status);
    }
    res.set_content(Dump(ErrorJson(e)), "application/json");
  });
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (ready_ && !stopping_) {
      res.set_content(R"({"status":"ok"})", "application/json");
    } else {
      res.status = 503;
      res.set_content(stopping_ ? R"({"status":"stopping"})" : R"({"status":"loading"})",
                      "application/json");
    }
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    const kvserve::EngineStats stats = ready_ ? engine_->stats() : kvserve::EngineStats{};
    res.set_content(metrics_.Render(stats, model_id_), "text/plain; version=0.0.4");
  });
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) { Models(res); });
  s.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    Completion(req, res, /*chat=*/false);
  });
  s.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    Completion(req, res, /*chat=*/true);
  });
}

void Server::Models(httplib::Response& res) const {
  const nlohmann::json model = {{"id", model_id_},
                                {"object", "model"},
                                {"created", 0},
                                {"owned_by", "kvserve"},
                                {"meta",
                                 {{"n_vocab", model_->n_vocab()},
                                  {"n_ctx", engine_->options().n_ctx},
                                  {"n_ctx_train", model_->n_ctx_train()},
                                  {"chat_template", ChatFormatName(chat_format_)}}}};
  res.set_content(Dump(nlohmann::json{{"object", "list"}, {"data", {model}}}), "application/json");
}

void Server::Completion(const httplib::Request& req, httplib::Response& res, bool chat) {
  nlohmann::json body = nlohmann::json::parse(req.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded()) {
    return SendError(
        res, ApiError{400, "invalid_request_error", "The request body is not valid JSON.", {}, {}});
  }
  CompletionRequest request;
  if (auto err = ParseCompletionRequest(body, chat, &request)) return SendError(res, *err);
  if (!request.model.empty() && request.model != model_id_) {
    return SendError(res, ApiError{404, "invalid_request_error",
                                   "The model '" + request.model +
                                       "' does not exist; this "
                                       "server has '" +
                                       model_id_ + "'.",
                                   "model", "model_not_found"});
  }
  std::vector<int32_t> prompt;
  if (chat) {
    const RenderedChat rendered = RenderChat(chat_format_, request.messages);
    prompt = model_->Tokenize(rendered.text, rendered.add_bos);
  } else if (!request.prompt_ids.empty()) {
    prompt = request.prompt_ids;
  } else {
    prompt = model_->Tokenize(request.prompt_text, /*add_special=*/true);
  }
  const int32_t n_ctx = engine_->options().n_ctx;
  if (static_cast<int64_t>(prompt.size()) >= n_ctx) {
    return SendError(res,
                     ApiError{400, "invalid_request_error",
                              "This model's maximum context length is " + std::to_string(n_ctx) +
                                  " tokens; the prompt has " + std::to_string(prompt.size()) + ".",
                              chat ? "messages" : "prompt", "context_length_exceeded"});
  }
  const int64_t limit = engine_->options().n_parallel + options_.max_queue;
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
    return SendError(res, ApiError{400, "invalid_request_error", error, {}, {}});
  }
  kvserve::Engine* engine = engine_.get();
  call->Attach(rid, [engine](uint64_t r) { engine->Cancel(r); });
  res.set_chunked_content_provider(
      request.stream ? "text/event-stream" : "application/json",
      [call](size_t, httplib::DataSink& sink) {
        try {
          bool done = false;
          const bool alive = call->Pump(
              [&sink](const std::string& s) { return sink.write(s.data(), s.size()); }, &done);
          if (alive && done) sink.done();
          return alive;
        } catch (const std::exception& e) {  // never let a response kill the server
          KVS_LOG_ERROR("response failed: %s", e.what());
          call->Abandon();
          return false;
        }
      },
      [call, this](bool) {
        call->Abandon();  // no-op when the response was complete
        in_flight_.fetch_sub(1);
      });
}

Expected<int> Server::Listen() {
  http_ = std::make_unique<httplib::Server>();
  // Every in-flight request holds a handler thread while it streams.
  const int threads = std::min(1024, options_.engine.n_parallel + options_.max_queue + 8);
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  Routes();
  int port = options_.port;
  if (port == 0) {
    port = http_->bind_to_any_port(options_.host);
  } else if (!http_->bind_to_port(options_.host, port)) {
    port = -1;
  }
  if (port <= 0) {
    return Status::Error(StrFormat("cannot listen on %s:%d (in use, or not an address here)",
                                   options_.host.c_str(), options_.port));
  }
  listening_ = true;
  listen_thread_ = std::thread([this] {
    http_->listen_after_bind();
    listening_ = false;
  });
  // stop() is a no-op until the loop runs: wait for it, so that Stop() can never be lost.
  while (!http_->is_running() && listening_) std::this_thread::yield();
  return port;
}

Status Server::Load() {
  std::string error;
  model_ = kvserve::Model::Load(options_.model_path, &error);
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
  // Requests without max_tokens may grow to -c: one such sequence must fit the pool.
  const kvserve::EngineStats s = engine_->stats();
  const int64_t positions = static_cast<int64_t>(s.kv_blocks_total) * s.block_size;
  if (positions < eo.n_ctx) {
    engine_.reset();
    return Status::Error(
        StrFormat("--kv-memory holds %lld positions, fewer than one full context "
                  "(-c %d); raise --kv-memory or lower -c",
                  static_cast<long long>(positions), eo.n_ctx));
  }
  ready_ = true;
  return Status::Ok();
}

void Server::Stop() {
  std::lock_guard<std::mutex> lock(stop_mu_);
  stopping_ = true;  // new requests get 503 from here on
  // Cancelling what runs lets every handler finish its response; stopping the listener then
  // joins the handler threads, after which nothing refers to the engine.
  if (engine_) engine_->CancelAll();
  // httplib stops writing chunked bodies the moment it stops, so let the cancelled responses
  // reach their end ([DONE]) first; a client that does not read gets a few seconds.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (in_flight_ > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (http_) http_->stop();
  if (listen_thread_.joinable()) listen_thread_.join();
  engine_.reset();
}

}  // namespace kvs::server
