#include "server/http/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/log.h"
#include "server/http/body_decoder.h"
#include "server/http/request_parser.h"

namespace kvs::server::http {

struct HttpServer::Conn {
  Conn(int fd, const Limits& limits) : fd(fd), parser(limits) {}
  enum class Phase {
    kIdle,        // waiting for the first byte of a request
    kReading,     // a request has started arriving
    kDispatched,  // a worker has it (not watched by the loop)
    kWriting,     // the loop sends a buffered response
  };
  const int fd;
  Phase phase = Phase::kIdle;
  uint32_t events = 0;  // what epoll watches for (0: not registered)
  RequestParser parser;
  std::string in;   // received, not yet parsed
  std::string out;  // a buffered response being sent
  size_t out_sent = 0;
  Clock::time_point deadline;
  Clock::time_point since;  // when the current wait began (the stalest is evicted first)
  bool body_started = false;
  bool peer_closed = false;  // the client shut its sending side
  bool keep_alive = false;   // after the response in progress
  int served = 0;
  size_t reserved = 0;  // body bytes counted against max_buffered_body_bytes
  // A handler's deadline for the rest of a streamed body (steady-clock ns; 0: none).
  std::atomic<int64_t> body_deadline_ns{0};
};

namespace {

constexpr auto kTick = std::chrono::milliseconds(100);  // deadlines are checked this often
constexpr size_t kReadChunk = 64 << 10;

// Open files this process may have; raised to the hard limit as servers do, since every
// connection is one.
int RaiseFileLimit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 1024;
  if (rl.rlim_cur < rl.rlim_max) {
    rlimit want = rl;
    want.rlim_cur = rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &want) == 0) rl = want;
  }
  return rl.rlim_cur > (1 << 20) ? (1 << 20) : static_cast<int>(rl.rlim_cur);
}

}  // namespace

HttpServer::HttpServer(HttpServerOptions options, Handler handler, ErrorResponder error,
                       HeadFilter head_filter)
    : options_(std::move(options)),
      handler_(std::move(handler)),
      error_(std::move(error)),
      head_filter_(std::move(head_filter)) {}

HttpServer::~HttpServer() {
  Stop(std::chrono::milliseconds(0));
}

HttpServer::Stats HttpServer::stats() const {
  return {open_.load(), accepted_.load(), timed_out_.load(), evicted_.load(), refused_.load()};
}

Expected<int> HttpServer::Listen() {
  const std::string where = options_.host + ":" + std::to_string(options_.port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port_text = std::to_string(options_.port);
  if (int rc = getaddrinfo(options_.host.c_str(), port_text.c_str(), &hints, &found); rc != 0) {
    return Status::Error(StrFormat("cannot listen on %s: %s", where.c_str(), gai_strerror(rc)));
  }
  int fd = socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  // SO_REUSEADDR lets a restarted server bind past old TIME_WAIT connections; SO_REUSEPORT is
  // not set, so a second server on a port in use fails here instead of sharing it.
  const int one = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (fd < 0 || bind(fd, found->ai_addr, found->ai_addrlen) != 0 || listen(fd, SOMAXCONN) != 0) {
    const int err = errno;
    freeaddrinfo(found);
    if (fd >= 0) close(fd);
    return Status::Error(StrFormat("cannot listen on %s: %s%s", where.c_str(), std::strerror(err),
                                   err == EADDRINUSE ? " (is another server running there?)" : ""));
  }
  freeaddrinfo(found);
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len);
  const int port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);

  // Leave room for the model file, logs and the engine's own descriptors.
  max_connections_ = std::max(1, std::min(options_.max_connections, RaiseFileLimit() - 64));
  listen_fd_ = fd;
  epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (epoll_fd_ < 0 || wake_fd_ < 0) return Status::Error("cannot create the event loop");
  for (int watched : {listen_fd_, wake_fd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = watched;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, watched, &ev);
  }
  // Workers start as requests need them (see Dispatch); the loop is the only thread now.
  try {
    loop_thread_ = std::thread([this] { Loop(); });
  } catch (const std::system_error& e) {
    return Status::Error(StrFormat("cannot start the HTTP thread: %s", e.what()));
  }
  return port;
}

void HttpServer::Wake() {
  const uint64_t one = 1;
  if (wake_fd_ >= 0) (void)!write(wake_fd_, &one, sizeof(one));
}

void HttpServer::Stop(std::chrono::milliseconds grace) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = true;
    stop_accepting_ = true;
  }
  if (!loop_thread_.joinable()) {  // never listened
    if (listen_fd_ >= 0) close(listen_fd_);
    listen_fd_ = -1;
    return;
  }
  Wake();
  {
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait_for(lock, grace, [this] { return dispatched_ == 0; });
  }
  cut_ = true;  // from here every handler's write fails at once
  Wake();
  std::vector<std::thread> workers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    workers_quit_ = true;  // no worker starts from here on
    workers.swap(workers_);
  }
  work_cv_.notify_all();
  for (std::thread& t : workers) t.join();
  {
    std::lock_guard<std::mutex> lock(mu_);
    quit_ = true;
  }
  Wake();
  loop_thread_.join();
  for (auto& [fd, c] : conns_) close(fd);
  conns_.clear();
  open_ = 0;
  if (listen_fd_ >= 0) close(listen_fd_);
  close(epoll_fd_);
  close(wake_fd_);
  listen_fd_ = epoll_fd_ = wake_fd_ = -1;
}

// ---- The event loop --------------------------------------------------------------------------

void HttpServer::Loop() {
  epoll_event events[256];
  Clock::time_point last_scan = Clock::now();
  while (true) {
    const int n = epoll_wait(epoll_fd_, events, 256, static_cast<int>(kTick.count()));
    Clock::time_point now = Clock::now();
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == listen_fd_) {
        Accept(now);
      } else if (fd == wake_fd_) {
        uint64_t count;
        (void)!read(wake_fd_, &count, sizeof(count));
      } else if (auto it = conns_.find(fd); it != conns_.end()) {
        OnEvent(it->second.get(), events[i].events, now);
      }
    }
    std::vector<Conn*> returned;
    bool stop_accepting, quit;
    {
      std::lock_guard<std::mutex> lock(mu_);
      returned.swap(returned_);
      stop_accepting = stop_accepting_;
      quit = quit_;
    }
    for (Conn* c : returned) OnReturned(c, now);
    if (stop_accepting && accepting_) {
      accepting_ = false;
      close(listen_fd_);  // also leaves the epoll set
      listen_fd_ = -1;
      std::vector<Conn*> idle;
      for (auto& [fd, c] : conns_) {
        if (c->phase != Conn::Phase::kDispatched) idle.push_back(c.get());
      }
      for (Conn* c : idle) Close(c);
    }
    if (cut_ && !cut_done_) {
      // Handlers still writing to clients that do not read: make their writes fail now.
      cut_done_ = true;
      for (auto& [fd, c] : conns_) {
        if (c->phase == Conn::Phase::kDispatched) shutdown(fd, SHUT_RDWR);
      }
    }
    if (quit) return;
    if (accepting_ && accept_paused_until_ != Clock::time_point{} && now >= accept_paused_until_) {
      accept_paused_until_ = {};
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.fd = listen_fd_;
      epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
    }
    if (now - last_scan >= kTick) {
      last_scan = now;
      ExpireDeadlines(now);
    }
  }
}

void HttpServer::Accept(Clock::time_point now) {
  while (accepting_) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if ((errno == EMFILE || errno == ENFILE) && EvictOne()) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        // Out of descriptors with nothing to evict: stop polling the listener for a moment
        // instead of spinning on it.
        KVS_LOG_WARN("http: accept failed: %s", std::strerror(errno));
        epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listen_fd_, nullptr);
        accept_paused_until_ = now + kTick;
      }
      return;
    }
    if (static_cast<int>(conns_.size()) >= max_connections_ && !EvictOne()) {
      close(fd);
      ++refused_;
      continue;
    }
    const int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));  // tokens go out at once
    if (options_.socket_send_buffer > 0) {
      setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &options_.socket_send_buffer,
                 sizeof(options_.socket_send_buffer));
    }
    auto conn = std::make_unique<Conn>(fd, options_.limits);
    Conn* c = conn.get();
    conns_.emplace(fd, std::move(conn));
    ++accepted_;
    ++open_;
    c->deadline = now + options_.header_timeout;
    c->since = now;
    SetEvents(c, EPOLLIN | EPOLLRDHUP);
  }
}

void HttpServer::SetEvents(Conn* c, uint32_t events) {
  if (events == c->events) return;
  epoll_event ev{};
  ev.events = events;
  ev.data.fd = c->fd;
  if (events == 0) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->fd, nullptr);
  } else {
    epoll_ctl(epoll_fd_, c->events == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, c->fd, &ev);
  }
  c->events = events;
}

void HttpServer::ReleaseReservation(Conn* c) {
  reserved_body_bytes_ -= c->reserved;
  c->reserved = 0;
}

void HttpServer::Close(Conn* c) {
  ReleaseReservation(c);
  close(c->fd);  // leaves the epoll set too
  --open_;
  conns_.erase(c->fd);
}

void HttpServer::OnEvent(Conn* c, uint32_t events, Clock::time_point now) {
  if (c->phase == Conn::Phase::kWriting) {
    if (events & (EPOLLERR | EPOLLHUP)) return Close(c);
    if (events & EPOLLOUT) Flush(c, now);
    return;
  }
  if (c->phase == Conn::Phase::kDispatched) return;
  // Reading. A bounded amount per event, so that one fast client cannot starve the rest; read
  // through one loop-wide buffer so that a connection's own buffer holds only what it sent.
  size_t got = 0;
  char buf[kReadChunk];
  while (got < 4 * kReadChunk) {
    const ssize_t n = recv(c->fd, buf, sizeof(buf), 0);
    if (n > 0) {
      c->in.append(buf, static_cast<size_t>(n));
      got += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      c->peer_closed = true;
    } else if (errno == EINTR) {
      continue;
    } else if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return Close(c);
    }
    break;
  }
  const int fd = c->fd;
  Advance(c, now);  // may close c
  // A client that stopped sending without a whole request will never complete one.
  auto it = conns_.find(fd);
  if (it != conns_.end() && it->second->peer_closed &&
      (it->second->phase == Conn::Phase::kIdle || it->second->phase == Conn::Phase::kReading)) {
    Close(it->second.get());
  }
}

void HttpServer::Advance(Conn* c, Clock::time_point now) {
  if (c->in.empty() && !c->parser.started()) return;
  if (c->phase == Conn::Phase::kIdle) {
    c->phase = Conn::Phase::kReading;
    c->deadline = now + options_.header_timeout;
    c->since = now;
  }
  const RequestParser::State state = c->parser.Parse(&c->in);
  if (state == RequestParser::State::kError) {
    return RespondError(c, c->parser.error_status(), c->parser.error_message(), now);
  }
  if (c->parser.head_done() && !c->body_started) {
    c->body_started = true;
    c->deadline = now + options_.body_timeout;
    if (head_filter_) {
      if (std::optional<Response> refused = head_filter_(c->parser.request())) {
        return Refuse(c, *refused, now);
      }
    }
  }
  if (c->parser.head_done()) {
    // Count the body bytes actually held (a declared length costs nothing until it arrives).
    const size_t held = c->in.size() + c->parser.request().body.size();
    reserved_body_bytes_ += held - c->reserved;
    c->reserved = held;
    if (reserved_body_bytes_ > options_.max_buffered_body_bytes) {
      return RespondError(c, 503, "Too many request bodies are being received; retry later.", now);
    }
  }
  if (state == RequestParser::State::kDone) return Dispatch(c);
  if (c->parser.wants_continue()) {
    // The client waits for this before sending the body. The socket's buffer is empty at this
    // point, so one non-blocking send of 25 bytes goes out whole.
    static constexpr char kContinue[] = "HTTP/1.1 100 Continue\r\n\r\n";
    (void)!send(c->fd, kContinue, sizeof(kContinue) - 1, MSG_NOSIGNAL);
    c->parser.set_continue_sent();
  }
}

void HttpServer::Dispatch(Conn* c) {
  SetEvents(c, 0);
  c->phase = Conn::Phase::kDispatched;
  ++c->served;
  c->keep_alive =
      c->parser.keep_alive() && !c->peer_closed && c->served < options_.max_requests_per_connection;
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(c);
    ++dispatched_;
    // One more worker when the queued jobs outnumber the free ones: threads (and their stacks)
    // only as the load needs, up to worker_threads. If the system refuses a thread the job
    // waits for a free one.
    if (static_cast<int>(jobs_.size()) > idle_workers_ &&
        static_cast<int>(workers_.size()) < options_.worker_threads && !workers_quit_) {
      try {
        workers_.emplace_back([this] { Worker(); });
        ++idle_workers_;  // it takes a job as soon as it runs
      } catch (const std::system_error& e) {
        if (workers_.empty()) KVS_LOG_ERROR("http: cannot start a worker: %s", e.what());
      }
    }
  }
  work_cv_.notify_one();
}

void HttpServer::OnReturned(Conn* c, Clock::time_point now) {
  ReleaseReservation(c);
  c->parser.Reset();
  c->body_started = false;
  if (!accepting_ || cut_) return Close(c);  // stopping: no more responses or requests
  if (c->out.empty()) return FinishResponse(c, now);
  c->phase = Conn::Phase::kWriting;
  c->deadline = now + options_.write_timeout;
  c->since = now;
  Flush(c, now);
}

void HttpServer::Flush(Conn* c, Clock::time_point now) {
  while (c->out_sent < c->out.size()) {
    const ssize_t n =
        send(c->fd, c->out.data() + c->out_sent, c->out.size() - c->out_sent, MSG_NOSIGNAL);
    if (n > 0) {
      c->out_sent += static_cast<size_t>(n);
      c->deadline = now + options_.write_timeout;  // progress
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      SetEvents(c, EPOLLOUT);
      return;
    }
    return Close(c);
  }
  c->out.clear();
  c->out.shrink_to_fit();
  c->out_sent = 0;
  FinishResponse(c, now);
}

void HttpServer::FinishResponse(Conn* c, Clock::time_point now) {
  if (!c->keep_alive) return Close(c);
  c->phase = Conn::Phase::kIdle;
  c->deadline = now + options_.idle_timeout;
  c->since = now;
  SetEvents(c, EPOLLIN | EPOLLRDHUP);
  if (!c->in.empty()) Advance(c, now);  // a pipelined request already arrived
}

void HttpServer::RespondError(Conn* c, int status, const std::string& message,
                              Clock::time_point now) {
  Refuse(c, error_(status, message), now);
}

void HttpServer::Refuse(Conn* c, const Response& res, Clock::time_point now) {
  ReleaseReservation(c);
  c->in.clear();
  c->keep_alive = false;  // the stream's framing is lost after a refused request
  c->out = SerializeResponse(res, /*keep_alive=*/false, c->parser.request().method == "HEAD");
  c->out_sent = 0;
  c->phase = Conn::Phase::kWriting;
  c->deadline = now + options_.write_timeout;
  c->since = now;
  Flush(c, now);
}

void HttpServer::ExpireDeadlines(Clock::time_point now) {
  std::vector<Conn*> late;
  for (auto& [fd, c] : conns_) {
    if (c->phase != Conn::Phase::kDispatched && c->deadline <= now) late.push_back(c.get());
  }
  for (Conn* c : late) {
    ++timed_out_;
    if (c->phase == Conn::Phase::kReading) {
      // Tell the client why (best effort: one non-blocking send), then close.
      const std::string reply = SerializeResponse(
          error_(408, "The request did not arrive in time."), /*keep_alive=*/false);
      (void)!send(c->fd, reply.data(), reply.size(), MSG_NOSIGNAL);
    }
    Close(c);
  }
}

bool HttpServer::EvictOne() {
  // Idle keep-alive connections go first, then the request that has been arriving longest,
  // then the response that has waited longest for its client to read it.
  const auto rank = [](const Conn& c) {
    switch (c.phase) {
      case Conn::Phase::kIdle:
        return 0;
      case Conn::Phase::kReading:
        return 1;
      case Conn::Phase::kWriting:
        return 2;
      default:
        return 3;  // a worker holds it
    }
  };
  Conn* victim = nullptr;
  for (auto& [fd, c] : conns_) {
    if (rank(*c) == 3) continue;
    if (!victim || rank(*c) < rank(*victim) ||
        (rank(*c) == rank(*victim) && c->since < victim->since)) {
      victim = c.get();
    }
  }
  if (!victim) return false;
  ++evicted_;
  Close(victim);
  return true;
}

// ---- Workers ---------------------------------------------------------------------------------

void HttpServer::Worker() {
  while (true) {
    Conn* c = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [this] { return !jobs_.empty() || workers_quit_; });
      if (jobs_.empty()) return;
      c = jobs_.front();
      jobs_.pop_front();
      --idle_workers_;
    }
    Serve(c);
    {
      std::lock_guard<std::mutex> lock(mu_);
      returned_.push_back(c);
      --dispatched_;
      ++idle_workers_;
    }
    done_cv_.notify_all();
    Wake();
  }
}

void HttpServer::Serve(Conn* c) {
  if (cut_) {
    c->keep_alive = false;
    return;
  }
  Request& req = c->parser.request();
  Response res;
  const DecodeError decoded = DecodeBody(&req, options_.limits.max_body_bytes);
  if (decoded.status != 0) {
    res = error_(decoded.status, decoded.message);
    c->keep_alive = false;
  } else {
    try {
      handler_(req, res);
    } catch (const std::exception& e) {  // a handler's bug must not take the server down
      KVS_LOG_ERROR("http: %s %s failed: %s", req.method.c_str(), req.path.c_str(), e.what());
      res = error_(500, "The server failed to answer this request.");
      c->keep_alive = false;
    }
  }
  const bool head_only = req.method == "HEAD";
  if (!res.stream || head_only) {
    c->out = SerializeResponse(res, c->keep_alive, head_only);  // the loop sends it
    c->out_sent = 0;
    return;
  }
  // HTTP/1.0 has no chunked coding: the body ends when the connection closes.
  const bool chunked = req.minor_version >= 1;
  if (!chunked) c->keep_alive = false;
  c->body_deadline_ns = 0;
  struct Writer : BodyWriter {
    HttpServer* server;
    Conn* c;
    bool chunked;
    bool ok;
    bool Write(std::string_view data) override {
      if (ok && !data.empty()) ok = server->WriteAll(c, chunked ? Chunk(data) : std::string(data));
      return ok;
    }
    void SetDeadline(Clock::time_point deadline) override {
      const auto ns =
          std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch());
      c->body_deadline_ns = std::max<int64_t>(1, ns.count());  // 0 means none
    }
  } writer;
  writer.server = this;
  writer.c = c;
  writer.chunked = chunked;
  writer.ok = WriteAll(c, SerializeHead(res, c->keep_alive, chunked ? kChunked : kUntilClose));
  try {
    res.stream(writer);
  } catch (const std::exception& e) {
    KVS_LOG_ERROR("http: streaming %s failed: %s", req.path.c_str(), e.what());
    writer.ok = false;
  }
  if (writer.ok && chunked) writer.ok = WriteAll(c, Chunk(""));
  if (!writer.ok) c->keep_alive = false;
}

bool HttpServer::WriteAll(Conn* c, std::string_view data) {
  Clock::time_point progress = Clock::now();
  while (!data.empty()) {
    if (cut_) return false;
    const int64_t deadline = c->body_deadline_ns.load();
    if (deadline != 0 && Clock::now().time_since_epoch() > std::chrono::nanoseconds(deadline)) {
      return false;  // the handler's deadline for the rest of the body
    }
    const ssize_t n = send(c->fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
      progress = Clock::now();
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (Clock::now() - progress > options_.write_timeout) return false;
      pollfd p{c->fd, POLLOUT, 0};
      poll(&p, 1, static_cast<int>(kTick.count()));  // wakes for Stop's cut within a tick
      continue;
    }
    return false;
  }
  return true;
}

}  // namespace kvs::server::http
