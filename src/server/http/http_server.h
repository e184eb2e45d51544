// A small HTTP/1.1 server built to face untrusted clients, in the way nginx and Redis are:
// one event-loop thread owns every connection while it is idle, sending its request or
// receiving a buffered response, so a slow or silent client costs a few kilobytes and never a
// thread. Only a complete, checked request reaches a worker thread (the handler); a streamed
// response is written from that worker with a no-progress deadline.
//
// What a client can cost is bounded:
//  - time: the whole head must arrive within header_timeout of its first byte, the whole body
//    within body_timeout of the head, the next request within idle_timeout; a response that
//    makes no progress for write_timeout is cut;
//  - memory: the head, the body (also once decompressed) and the body bytes received by all
//    connections at once are capped (431 / 413 / 503); a head filter refuses requests (no
//    key, no such path) before their bodies are read;
//  - connections: beyond max_connections the stalest idle, unfinished or unread connection is
//    closed to make room, so that health checks and real clients still get in;
//  - shutdown: Stop returns within about its grace period whatever the clients do.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "server/http/http_message.h"

namespace kvs::server::http {

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: any free port
  Limits limits;
  int worker_threads = 16;     // handlers running at once (each streamed response holds one);
                               // started as the load needs them
  int max_connections = 4096;  // open at once (also capped by the process's file limit)
  size_t max_buffered_body_bytes = size_t{256} << 20;  // body bytes received, not yet handled
  std::chrono::milliseconds header_timeout{10000};     // the whole head, from its first byte
  std::chrono::milliseconds body_timeout{60000};       // the whole body, from the head's end
  std::chrono::milliseconds idle_timeout{5000};        // between keep-alive requests
  std::chrono::milliseconds write_timeout{30000};      // a response making no progress
  int max_requests_per_connection = 1000;
  int socket_send_buffer = 0;  // SO_SNDBUF of each connection (0: the system's autotuning)
};

// Fills the response to a request (on a worker thread; may block while it streams).
using Handler = std::function<void(Request&, Response&)>;
// The response for an error the server answers by itself (400, 408, 411, 413, 431, 503, ...).
using ErrorResponder = std::function<Response(int status, const std::string& message)>;
// Looks at a request's head before its body is read (on the event loop: quick, thread-safe):
// a response refuses the request (e.g. 401, 404) without receiving its body.
using HeadFilter = std::function<std::optional<Response>(const Request&)>;

class HttpServer {
 public:
  HttpServer(HttpServerOptions options, Handler handler, ErrorResponder error,
             HeadFilter head_filter = nullptr);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds (failing if the port is taken: no SO_REUSEPORT sharing) and starts serving on its
  // own threads. Returns the bound port.
  Expected<int> Listen();

  // Stops accepting and closes idle connections at once, waits up to `grace` for the handlers
  // to finish their responses, then cuts the connections they still write to and joins them.
  // Returns within about grace + 1 s whatever the clients do. Idempotent.
  void Stop(std::chrono::milliseconds grace);

  struct Stats {
    int64_t open = 0;       // connections open now
    int64_t accepted = 0;   // since start
    int64_t timed_out = 0;  // closed for missing a deadline
    int64_t evicted = 0;    // closed to make room under max_connections
    int64_t refused = 0;    // closed at accept: no room and nothing to evict
  };
  Stats stats() const;

 private:
  struct Conn;
  using Clock = std::chrono::steady_clock;

  void Loop();
  void Accept(Clock::time_point now);
  void OnEvent(Conn* c, uint32_t events, Clock::time_point now);
  void Advance(Conn* c, Clock::time_point now);
  void Dispatch(Conn* c);
  void OnReturned(Conn* c, Clock::time_point now);
  void Flush(Conn* c, Clock::time_point now);
  void FinishResponse(Conn* c, Clock::time_point now);
  void RespondError(Conn* c, int status, const std::string& message, Clock::time_point now);
  void Refuse(Conn* c, const Response& res, Clock::time_point now);
  void ExpireDeadlines(Clock::time_point now);
  bool EvictOne();
  void SetEvents(Conn* c, uint32_t events);
  void Close(Conn* c);
  void ReleaseReservation(Conn* c);
  void Wake();

  void Worker();
  void Serve(Conn* c);
  bool WriteAll(Conn* c, std::string_view data);

  const HttpServerOptions options_;
  const Handler handler_;
  const ErrorResponder error_;
  const HeadFilter head_filter_;
  int max_connections_ = 0;
  int listen_fd_ = -1;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::thread loop_thread_;
  std::vector<std::thread> workers_;

  // Loop thread only.
  std::unordered_map<int, std::unique_ptr<Conn>> conns_;
  size_t reserved_body_bytes_ = 0;
  bool accepting_ = true;
  Clock::time_point accept_paused_until_{};

  // Shared between the loop, the workers and Stop.
  std::mutex mu_;
  std::condition_variable work_cv_;  // jobs_ or workers_quit_
  std::condition_variable done_cv_;  // dispatched_ went down
  std::deque<Conn*> jobs_;
  std::vector<Conn*> returned_;
  int dispatched_ = 0;    // connections a worker holds or will
  int idle_workers_ = 0;  // started workers not serving a job
  bool stop_accepting_ = false;
  bool workers_quit_ = false;
  bool quit_ = false;
  bool stopped_ = false;
  std::atomic<bool> cut_{false};  // Stop's grace is over: handlers' writes fail at once
  bool cut_done_ = false;         // loop: the held connections were shut down

  std::atomic<int64_t> open_{0}, accepted_{0}, timed_out_{0}, evicted_{0}, refused_{0};
};

}  // namespace kvs::server::http
