#include "kv/zmq_event_publisher.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <iterator>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "core/log.h"

namespace kvs {

namespace {

constexpr size_t kSeqBytes = 8;
// Replay requests served per wake-up before the loop looks at the batch queue again: a client
// that floods the replay socket delays batches by at most this many answers.
constexpr int kReplayRequestsPerRound = 64;
// The first few malformed replay requests are logged, then one in this many: a broken client
// cannot fill the log.
constexpr int64_t kBadReplayLogEvery = 1000;

void PutBigEndian64(uint64_t v, uint8_t* out) {
  for (size_t i = 0; i < kSeqBytes; ++i) out[i] = static_cast<uint8_t>(v >> (56 - 8 * i));
}

uint64_t GetBigEndian64(const uint8_t* p) {
  uint64_t v = 0;
  for (size_t i = 0; i < kSeqBytes; ++i) v = v << 8 | p[i];
  return v;
}

double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// ZeroMQ reports errors by throwing zmq::error_t; only bind and connect failures are expected
// (bad endpoints, ports in use), and they become a Status naming the endpoint.
// A tcp://, ws:// or wss:// endpoint names a host and a port 1-65535, or "*" (a free one, logged
// once bound): ZeroMQ itself takes 99999 as 34463 (modulo 65536) and 0 as "any port", and an empty
// host binds nothing and then "connects" to nothing, all without a word. ZeroMQ's "SRC;DST" form
// is two such addresses; ws's path after the port is ZeroMQ's business.
Status CheckEndpointPort(const std::string& endpoint, const char* flag) {
  const size_t scheme_end = endpoint.find("://");
  if (scheme_end == std::string::npos) return Status::Ok();
  const std::string scheme = endpoint.substr(0, scheme_end);
  if (scheme != "tcp" && scheme != "ws" && scheme != "wss") return Status::Ok();
  std::string rest = endpoint.substr(scheme_end + 3);
  if (scheme != "tcp") rest = rest.substr(0, rest.find('/'));
  const auto bad = [&](const char* why) {
    return Status::Error(StrFormat("%s %s: %s", flag, endpoint.c_str(), why));
  };
  size_t begin = 0;
  do {
    const size_t semicolon = rest.find(';', begin);
    const std::string address =
        rest.substr(begin, semicolon == std::string::npos ? std::string::npos : semicolon - begin);
    begin = semicolon == std::string::npos ? std::string::npos : semicolon + 1;
    const size_t colon = address.rfind(':');
    const size_t bracket = address.rfind(']');
    if (colon == std::string::npos || (bracket != std::string::npos && colon < bracket)) {
      return bad("no port (HOST:PORT)");
    }
    if (colon == 0) return bad("no host (HOST:PORT; * for every interface)");
    const std::string port = address.substr(colon + 1);
    if (port == "*") continue;
    bool digits = !port.empty() && port.size() <= 5;
    for (char c : port) digits = digits && c >= '0' && c <= '9';
    const long value = digits ? std::stol(port) : 0;
    if (value < 1 || value > 65535) return bad("the port must be 1-65535 (or * for a free one)");
  } while (begin != std::string::npos);
  return Status::Ok();
}

Status BindOrConnect(zmq::socket_t& socket, const std::string& endpoint, KvEventEndpointMode mode,
                     const char* role, bool* bound) {
  if (endpoint.find('[') != std::string::npos) socket.set(zmq::sockopt::ipv6, 1);
  if (mode == KvEventEndpointMode::kConnect) {
    try {
      socket.connect(endpoint);
      *bound = false;
      return Status::Ok();
    } catch (const zmq::error_t& e) {
      return Status::Error(StrFormat("kv events: cannot connect the %s socket to %s: %s", role,
                                     endpoint.c_str(), e.what()));
    }
  }
  // ZeroMQ's bind reads a host as an interface name or an IP, never a DNS name: "localhost",
  // which users write for the loopback, is bound as 127.0.0.1.
  constexpr std::string_view kLocalhost = "tcp://localhost:";
  std::string bind_endpoint = endpoint;
  if (endpoint.starts_with(kLocalhost)) {
    bind_endpoint = "tcp://127.0.0.1:" + endpoint.substr(kLocalhost.size());
  }
  try {
    socket.bind(bind_endpoint);
    *bound = true;
    return Status::Ok();
  } catch (const zmq::error_t& e) {
    // Not an address of this machine (another host's IP; a host name, which ZeroMQ's bind reads
    // as a network interface name): the router binds it and we connect, as vLLM would.
    const bool foreign = e.num() == EADDRNOTAVAIL || e.num() == ENODEV;
    if (mode == KvEventEndpointMode::kAuto && foreign && !KvEventEndpointAlwaysBinds(endpoint)) {
      KVS_LOG_INFO("kv events: %s is not an address of this machine (%s): connecting to it",
                   endpoint.c_str(), e.what());
      return BindOrConnect(socket, endpoint, KvEventEndpointMode::kConnect, role, bound);
    }
    std::string hint;
    if (e.num() == EADDRINUSE) {
      hint = " (another process holds the port; if it is a subscriber that binds, connect to it)";
    }
    return Status::Error(StrFormat("kv events: cannot bind the %s socket to %s: %s%s", role,
                                   endpoint.c_str(), e.what(), hint.c_str()));
  }
}

}  // namespace

bool KvEventEndpointAlwaysBinds(std::string_view endpoint) {
  return endpoint.find('*') != std::string_view::npos ||
         endpoint.find("::") != std::string_view::npos || endpoint.starts_with("ipc://") ||
         endpoint.starts_with("inproc://");
}

ZmqKvEventPublisher::ZmqKvEventPublisher(ZmqKvEventPublisherConfig config)
    : config_(std::move(config)) {}

Expected<std::unique_ptr<ZmqKvEventPublisher>> ZmqKvEventPublisher::Open(
    ZmqKvEventPublisherConfig config) {
  if (config.endpoint.empty()) return Status::Error("kv events: no endpoint");
  KVS_RETURN_IF_ERROR(CheckEndpointPort(config.endpoint, "--kv-events"));
  KVS_RETURN_IF_ERROR(CheckEndpointPort(config.replay_endpoint, "--kv-events-replay"));
  if (config.buffer_steps < 0 || config.hwm < 0 || config.max_queue < 1 || config.linger_ms < 0) {
    return Status::Error(
        StrFormat("kv events: bad limits (buffer_steps %d, hwm %d, max_queue %d, linger_ms %d)",
                  config.buffer_steps, config.hwm, config.max_queue, config.linger_ms));
  }
  std::unique_ptr<ZmqKvEventPublisher> p(new ZmqKvEventPublisher(std::move(config)));
  KVS_RETURN_IF_ERROR(p->OpenSockets());
  p->wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (p->wake_fd_ < 0) {
    return Status::Error(StrFormat("kv events: eventfd: %s", std::strerror(errno)));
  }
  p->thread_ = std::thread([raw = p.get()] { raw->Loop(); });
  KVS_LOG_INFO("kv events: publishing on %s (%s)%s%s", p->endpoint_.c_str(),
               p->bound_ ? "bound" : "connected", p->replay_endpoint_.empty() ? "" : ", replay on ",
               p->replay_endpoint_.c_str());
  return p;
}

Status ZmqKvEventPublisher::OpenSockets() {
  try {
    ctx_ = std::make_unique<zmq::context_t>(1);
    pub_ = std::make_unique<zmq::socket_t>(*ctx_, zmq::socket_type::pub);
    pub_->set(zmq::sockopt::sndhwm, config_.hwm);
    pub_->set(zmq::sockopt::linger, config_.linger_ms);
    KVS_RETURN_IF_ERROR(BindOrConnect(*pub_, config_.endpoint, config_.mode, "PUB", &bound_));
    endpoint_ = bound_ ? pub_->get(zmq::sockopt::last_endpoint) : config_.endpoint;
    if (config_.replay_endpoint.empty()) return Status::Ok();
    replay_ = std::make_unique<zmq::socket_t>(*ctx_, zmq::socket_type::router);
    // A whole replay (buffer_steps answers and the end marker) fits in one client's pipe: past
    // the high-water mark a ROUTER drops answers silently.
    replay_->set(zmq::sockopt::sndhwm, config_.buffer_steps + 16);
    replay_->set(zmq::sockopt::linger, 0);  // answers to clients gone are not worth a wait
    // A request is 8 bytes; a client sending large frames is cut off rather than buffered.
    replay_->set(zmq::sockopt::maxmsgsize, int64_t{256});
    bool replay_bound = false;
    KVS_RETURN_IF_ERROR(BindOrConnect(*replay_, config_.replay_endpoint, KvEventEndpointMode::kBind,
                                      "replay", &replay_bound));
    replay_endpoint_ = replay_->get(zmq::sockopt::last_endpoint);
    return Status::Ok();
  } catch (const zmq::error_t& e) {
    return Status::Error(StrFormat("kv events: %s", e.what()));
  }
}

ZmqKvEventPublisher::~ZmqKvEventPublisher() {
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    Wake();
    thread_.join();
  }
  // The thread has stopped (join is the memory barrier ZeroMQ asks for before another thread
  // touches its sockets). Closing them and the context waits for linger_ms at most.
  pub_.reset();
  replay_.reset();
  ctx_.reset();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void ZmqKvEventPublisher::Wake() {
  const uint64_t one = 1;
  // Non-blocking: the counter only saturates after 2^64 - 2 unread wake-ups.
  [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
}

void ZmqKvEventPublisher::Publish(std::vector<KvEvent> events) {
  if (events.empty()) return;
  const double ts = config_.clock ? config_.clock() : WallSeconds();
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t seq = stats_.next_seq++;
    if (stop_ || queue_.size() >= static_cast<size_t>(config_.max_queue)) {
      ++stats_.batches_dropped;
      stats_.events_dropped += static_cast<int64_t>(events.size());
      return;
    }
    // A non-empty queue has a wake-up pending already (the thread reads the eventfd before it
    // takes the queue).
    wake = queue_.empty();
    queue_.push_back(Pending{seq, ts, std::move(events)});
  }
  if (wake) Wake();
}

bool ZmqKvEventPublisher::Flush(int64_t timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  auto drained = [&] { return queue_.empty() && !busy_; };
  if (timeout_ms < 0) {
    idle_.wait(lock, drained);
  } else {
    idle_.wait_for(lock, std::chrono::milliseconds(timeout_ms), drained);
  }
  return drained();
}

ZmqKvEventPublisherStats ZmqKvEventPublisher::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void ZmqKvEventPublisher::Loop() {
  // [0]: the eventfd (batches queued, or stop); [1]: replay requests.
  zmq_pollitem_t items[2] = {{nullptr, wake_fd_, ZMQ_POLLIN, 0}, {nullptr, 0, ZMQ_POLLIN, 0}};
  int n_items = 1;
  if (replay_) {
    items[1].socket = replay_->handle();
    n_items = 2;
  }
  while (true) {
    if (zmq_poll(items, n_items, -1) < 0) {
      if (zmq_errno() == EINTR) continue;
      // Nothing else is expected while the context lives; stopping the events beats spinning.
      KVS_LOG_ERROR("kv events: poll failed (%s); no more events are published",
                    zmq_strerror(zmq_errno()));
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      stats_.batches_dropped += static_cast<int64_t>(queue_.size());
      queue_.clear();
      idle_.notify_all();
      return;
    }
    if (items[0].revents & ZMQ_POLLIN) {
      uint64_t count;
      [[maybe_unused]] ssize_t n = ::read(wake_fd_, &count, sizeof(count));
    }
    std::deque<Pending> work;
    {
      std::lock_guard<std::mutex> lock(mu_);
      work.swap(queue_);
      busy_ = !work.empty();
    }
    for (Pending& batch : work) SendBatch(std::move(batch));
    bool stop;
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
      if (queue_.empty()) idle_.notify_all();
      stop = stop_ && queue_.empty();
    }
    if (n_items == 2 && (items[1].revents & ZMQ_POLLIN)) ServeReplayRequests();
    if (stop) return;
  }
}

void ZmqKvEventPublisher::SendBatch(Pending batch) {
  std::vector<uint8_t> payload = EncodeKvEventBatch(batch.ts, batch.events, config_.dp_rank);
  uint8_t seq[kSeqBytes];
  PutBigEndian64(batch.seq, seq);
  bool sent = false;
  try {
    // A PUB socket never blocks: past the high-water mark ZeroMQ drops the whole message for
    // that subscriber, who sees the gap in seq and asks the replay socket.
    const auto more = zmq::send_flags::sndmore | zmq::send_flags::dontwait;
    sent = pub_->send(zmq::buffer(config_.topic), more) && pub_->send(zmq::buffer(seq), more) &&
           pub_->send(zmq::buffer(payload), zmq::send_flags::dontwait);
  } catch (const zmq::error_t& e) {
    KVS_LOG_WARN("kv events: batch %llu not sent: %s", static_cast<unsigned long long>(batch.seq),
                 e.what());
  }
  // Kept for replay either way: a subscriber that missed it can still ask.
  if (config_.buffer_steps > 0) {
    buffer_.push_back(Buffered{batch.seq, std::move(payload)});
    while (buffer_.size() > static_cast<size_t>(config_.buffer_steps)) buffer_.pop_front();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (sent) {
      ++stats_.batches_published;
      stats_.events_published += static_cast<int64_t>(batch.events.size());
    } else {
      ++stats_.send_errors;
    }
  }
  if (config_.on_sent) config_.on_sent(batch.seq);
}

void ZmqKvEventPublisher::ServeReplayRequests() {
  for (int round = 0; round < kReplayRequestsPerRound; ++round) {
    std::vector<zmq::message_t> frames;
    try {
      if (!zmq::recv_multipart(*replay_, std::back_inserter(frames), zmq::recv_flags::dontwait)) {
        return;  // no more requests
      }
    } catch (const zmq::error_t& e) {
      KVS_LOG_WARN("kv events: replay request not read: %s", e.what());
      return;
    }
    // ROUTER puts the client's identity first. REQ (and a DEALER that mimics it) sends an empty
    // delimiter before the start seq and gets it back before each answer; a bare DEALER does not.
    const bool delimited = frames.size() == 3 && frames[1].size() == 0;
    const bool bare = frames.size() == 2;
    const zmq::message_t* start = delimited ? &frames[2] : bare ? &frames[1] : nullptr;
    if (start == nullptr || start->size() != kSeqBytes) {
      int64_t bad;
      {
        std::lock_guard<std::mutex> lock(mu_);
        bad = ++stats_.bad_replay_requests;
      }
      if (bad <= 10 || bad % kBadReplayLogEvery == 0) {
        KVS_LOG_WARN(
            "kv events: ignored a malformed replay request (%zu frames, start frame of %zu bytes; "
            "expected an 8-byte big-endian seq) [%lld so far]",
            frames.size(), start ? start->size() : size_t{0}, static_cast<long long>(bad));
      }
      continue;
    }
    const uint64_t from = GetBigEndian64(start->data<uint8_t>());
    int64_t answered = 0;  // batches sent in this answer
    try {
      const zmq::message_t& identity = frames[0];
      auto send_answer = [&](const void* seq, const void* data, size_t size) {
        const auto more = zmq::send_flags::sndmore | zmq::send_flags::dontwait;
        replay_->send(zmq::buffer(identity.data(), identity.size()), more);
        if (delimited) replay_->send(zmq::const_buffer(), more);
        replay_->send(zmq::buffer(seq, kSeqBytes), more);
        replay_->send(zmq::buffer(data, size), zmq::send_flags::dontwait);
      };
      uint8_t seq[kSeqBytes];
      for (const Buffered& b : buffer_) {
        if (b.seq < from) continue;
        PutBigEndian64(b.seq, seq);
        send_answer(seq, b.payload.data(), b.payload.size());
        ++answered;
      }
      {
        // Counted before the end marker goes: a client that has read it sees the stats.
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.replay_requests;
        stats_.replay_batches += answered;
      }
      PutBigEndian64(~uint64_t{0}, seq);  // -1 as a signed 8-byte number: the end
      send_answer(seq, nullptr, 0);
    } catch (const zmq::error_t& e) {
      KVS_LOG_WARN("kv events: replay answer not sent: %s", e.what());
    }
  }
}

}  // namespace kvs
