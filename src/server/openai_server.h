// The OpenAI-compatible HTTP server: /v1/completions, /v1/chat/completions (plain and SSE
// streamed), /v1/models, /health (503 while loading), /metrics (Prometheus). Talks to the engine
// only through the public API's thread-safe Submit/Cancel.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <semaphore>
#include <string>
#include <string_view>
#include <unordered_map>

#include "core/status.h"
#include "kvserve/kvserve.h"
#include "server/chat_template.h"
#include "server/coalesced_snapshot.h"
#include "server/http/http_server.h"
#include "server/metrics.h"
#include "server/openai_api.h"

namespace kvs::server {

inline constexpr const char* kKvDocumentsPath = "/v1/kv/documents";
inline constexpr const char* kKvLookupPath = "/v1/kv/lookup";
inline constexpr const char* kKvStatePath = "/v1/kv/state";
inline constexpr const char* kDashboardPath = "/dashboard";
// The dashboard's page (server/dashboard_page.cc): one self-contained HTML document.
std::string_view DashboardPage();
// /v1/kv/documents and /v1/kv/documents/{name}.
bool IsKvDocumentPath(const std::string& path);
// Answers with `e` in the OpenAI error format (and no stream).
void SendError(http::Response& res, const ApiError& e);

struct ServerOptions {
  std::string model_path;
  std::string host = "127.0.0.1";  // loopback unless told otherwise
  int port = 8080;                 // 0: any free port (tests)
  kvserve::EngineOptions engine;
  kvserve::ModelOptions model_options;
  std::string api_key;        // non-empty: /v1/* needs "Authorization: Bearer KEY"
  std::string chat_template;  // empty: detect from the GGUF
  std::string alias;          // the model id clients use; default: the file name without .gguf
  int32_t max_queue = 256;    // requests waiting beyond -np before new ones get 503
  size_t max_body_bytes = 8 << 20;  // also once decompressed
  // Connections and deadlines (see server/http/http_server.h); tests shorten them.
  int max_connections = 4096;
  std::chrono::milliseconds header_timeout{10000};
  std::chrono::milliseconds body_timeout{60000};
  std::chrono::milliseconds idle_timeout{5000};
  std::chrono::milliseconds write_timeout{30000};
  int socket_send_buffer = 0;  // SO_SNDBUF of each connection (0: autotuned; tests shrink it)
  // How long Stop lets cancelled responses reach their end before cutting the connections.
  std::chrono::milliseconds shutdown_grace{5000};
  bool dashboard = true;  // GET /dashboard (--no-dashboard: 404)
};

class Server {
 public:
  explicit Server(ServerOptions options);
  ~Server();

  // Binds and starts answering (health says "loading"); returns the bound port.
  Expected<int> Listen();
  // Loads the model and starts the engine; then requests are served.
  Status Load();
  // Stops accepting, cancels what runs, waits for the handlers, stops the engine. Idempotent.
  void Stop();
  bool running() const { return listening_.load(); }
  const std::string& model_id() const { return model_id_; }
  // The engine's KV pool and load (after Load).
  kvserve::EngineStats stats() const { return ready_ ? engine_->stats() : kvserve::EngineStats{}; }
  const kvserve::EngineOptions& engine_options() const { return engine_->options(); }
  // The blocks one full -c context takes at its peak (every KV group of the model's).
  int64_t blocks_per_context() const {
    const kvserve::EngineOptions& o = engine_options();
    return model_->kv_blocks_per_sequence(o.n_ctx, o.block_size, o.max_batch_tokens);
  }
  // What a cached KV block depends on besides its tokens (after Load): the KV format in one
  // line, and the weights' digest.
  std::string kv_format() const { return engine_->kv_format(); }
  std::string weights_digest() const { return model_->weights_digest(); }

 private:
  std::optional<http::Response> Admit(const http::Request& req) const;
  void Handle(http::Request& req, http::Response& res);
  void Completion(const http::Request& req, http::Response& res, bool chat);
  void Models(http::Response& res) const;
  // The request's prompt as tokens: its chat rendered and tokenized, its token ids checked
  // against the vocabulary (an error naming param), or its text tokenized.
  std::optional<ApiError> PromptTokens(const CompletionRequest& request, bool chat,
                                       const std::string& param, std::vector<int32_t>* out) const;
  // kv_routes.cc
  void KvDocuments(const http::Request& req, http::Response& res);
  void ResetPrefixCache(http::Response& res);
  void KvLookup(const http::Request& req, http::Response& res);
  // GET /v1/kv/state: the block map, running sequences and request figures (the dashboard's).
  void KvState(http::Response& res);
  std::optional<ApiError> PromptOfBody(const nlohmann::json& body, std::vector<int32_t>* tokens,
                                       std::string* cache_salt, std::string* param) const;
  bool Authorized(const http::Request& req) const;

  ServerOptions options_;
  std::unique_ptr<http::HttpServer> http_;
  std::atomic<bool> listening_{false};
  std::atomic<bool> ready_{false};
  std::atomic<bool> stopping_{false};
  std::shared_ptr<kvserve::Model> model_;
  std::unique_ptr<kvserve::Engine> engine_;
  std::string model_id_;
  ChatFormat chat_format_ = ChatFormat::kPlain;
  Metrics metrics_;
  std::atomic<int64_t> in_flight_{0};
  std::atomic<int64_t> next_id_{1};
  // The ids clients see (cmpl-N, chatcmpl-N) of the engine's requests, for /v1/kv/state.
  std::mutex response_ids_mu_;
  std::unordered_map<uint64_t, std::string> response_ids_;
  // GET /v1/kv/state walks the whole pool on the engine loop: pollers share one walk, and walks
  // start at least kKvStateInterval apart, so polling clients cannot stall decoding.
  struct KvStateReply {
    std::string error;  // empty when state holds the snapshot
    kvserve::KvCacheState state;
  };
  static constexpr std::chrono::milliseconds kKvStateInterval{100};
  CoalescedSnapshot<KvStateReply> kv_state_;
  std::mutex stop_mu_;
  std::counting_semaphore<> heavy_{2};  // large bodies being parsed and tokenized
};

}  // namespace kvs::server
