// Publishes KV events (kv/kv_events.h) the way vLLM's ZmqEventPublisher does, so that routers
// written for vLLM subscribe to kvserve unchanged (issue #22):
//   - a ZeroMQ PUB socket sends each batch as three frames: [topic, seq, payload], where seq is
//     an 8-byte big-endian unsigned number, 0 for the first batch and one more for each next;
//   - an optional ROUTER socket (the replay endpoint, always bound) answers a request holding a
//     start seq (8 bytes big-endian) with every buffered batch whose seq is >= start, one message
//     [seq, payload] each, then an end marker [-1 as 8 bytes big-endian signed, empty frame].
//     A REQ client sends [start] (ROUTER sees [identity, "", start]); a DEALER should send
//     ["", start] and reads ["", seq, payload] replies. A DEALER that sends just [start] is
//     answered without the empty frame. A REQ socket takes only one reply per request: to read a
//     whole replay, use a DEALER (tools/kv_events_subscriber.py does).
//
// Bind or connect. vLLM binds the PUB socket when the endpoint holds '*' or '::' or is ipc:// or
// inproc://, and connects otherwise. That makes `--kv-events tcp://127.0.0.1:5557` connect, where
// a user who names an address of this machine expects the server to publish there, as it serves
// HTTP on its own port. The rule here (kAuto): bind, and connect only when the address is not
// this machine's (bind fails with "Cannot assign requested address" or "No such device", e.g. a
// router's host name or another machine's IP: the case vLLM's convention exists for, llm-d's
// indexer binding and the engines connecting to it). Any other bind failure (the port in use,
// permission denied, a malformed endpoint) is an error naming the endpoint. "tcp://localhost:P"
// binds 127.0.0.1. kBind and kConnect force one or the other (kConnect: a subscriber that binds a
// port of this machine).
//
// Sequence numbers: a batch dropped because the queue was full still takes its number, so that
// subscribers see the gap (no replay can fill it) rather than silently missing its events.
//
// One thread owns both sockets (ZeroMQ sockets are not thread-safe): Publish only queues the
// events and wakes it through an eventfd, which the thread polls together with the replay
// socket, so batches and replay requests are served at once without a polling interval. The
// thread encodes, sends and keeps the last buffer_steps payloads for replay.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/status.h"
#include "kv/kv_events.h"

namespace zmq {
class context_t;
class socket_t;
}  // namespace zmq

namespace kvs {

enum class KvEventEndpointMode { kAuto, kBind, kConnect };

struct ZmqKvEventPublisherConfig {
  std::string endpoint = "tcp://*:5557";  // the PUB socket; "tcp://127.0.0.1:*" binds a free port
  std::string replay_endpoint;            // the ROUTER socket; empty: no replay
  KvEventEndpointMode mode = KvEventEndpointMode::kAuto;  // for endpoint (replay always binds)
  std::string topic;               // first frame of every message; "" matches every SUB
  int32_t buffer_steps = 10000;    // batches kept for replay (memory: their payloads)
  int32_t hwm = 100000;            // ZeroMQ send high-water mark of the PUB socket
  int32_t max_queue = 100000;      // batches waiting for the thread; past it: dropped
  std::optional<int32_t> dp_rank;  // the batch's data_parallel_rank; none leaves it out
  // How long closing waits for messages still queued to a connected peer (a bound PUB with no
  // subscriber has none): the bound on the destructor's wait.
  int32_t linger_ms = 1000;
  // Seconds since the epoch stamped on each batch when Publish is called (tests fix it).
  std::function<double()> clock;
  // Called on the publisher's thread after each batch is sent, with its seq: tests hold the
  // thread here to fill the queue; nothing else should block in it.
  std::function<void(uint64_t seq)> on_sent;
};

struct ZmqKvEventPublisherStats {
  int64_t batches_published = 0;  // sent on the PUB socket
  int64_t events_published = 0;   // events in those batches
  int64_t batches_dropped = 0;    // refused by Publish (queue full, or after shutdown began)
  int64_t events_dropped = 0;
  int64_t send_errors = 0;          // batches ZeroMQ refused to send (counted, not dropped twice)
  int64_t replay_requests = 0;      // well-formed requests answered
  int64_t replay_batches = 0;       // batches sent in answers
  int64_t bad_replay_requests = 0;  // ignored: wrong frame count or length
  uint64_t next_seq = 0;            // the seq the next batch gets
};

class ZmqKvEventPublisher final : public KvEventSink {
 public:
  // Opens the sockets (an error names the endpoint and ZeroMQ's reason) and starts the thread.
  static Expected<std::unique_ptr<ZmqKvEventPublisher>> Open(ZmqKvEventPublisherConfig config);
  // Sends what is queued, closes the sockets (waiting at most linger_ms for a connected peer)
  // and stops the thread. Never waits on a subscriber that is not there.
  ~ZmqKvEventPublisher() override;

  ZmqKvEventPublisher(const ZmqKvEventPublisher&) = delete;
  ZmqKvEventPublisher& operator=(const ZmqKvEventPublisher&) = delete;

  // Queues one step's events (stamped now); returns at once. Dropped and counted when the queue
  // holds max_queue batches. Empty: nothing is published.
  void Publish(std::vector<KvEvent> events) override;
  // Waits until every queued batch has been sent, or timeout_ms passed (< 0: no limit); true when
  // the queue emptied.
  bool Flush(int64_t timeout_ms);
  ZmqKvEventPublisherStats stats() const;

  // The endpoints as ZeroMQ resolved them (a bound "tcp://127.0.0.1:*" names its port here; a
  // connected endpoint reads as given). replay_endpoint() is empty without replay.
  const std::string& endpoint() const { return endpoint_; }
  const std::string& replay_endpoint() const { return replay_endpoint_; }
  bool bound() const { return bound_; }

 private:
  struct Pending {
    uint64_t seq;
    double ts;
    std::vector<KvEvent> events;
  };
  struct Buffered {
    uint64_t seq;
    std::vector<uint8_t> payload;  // the msgpack batch as sent
  };
  explicit ZmqKvEventPublisher(ZmqKvEventPublisherConfig config);
  Status OpenSockets();
  void Wake();
  void Loop();
  void SendBatch(Pending batch);
  void ServeReplayRequests();

  ZmqKvEventPublisherConfig config_;
  std::string endpoint_, replay_endpoint_;
  bool bound_ = false;
  std::unique_ptr<zmq::context_t> ctx_;
  std::unique_ptr<zmq::socket_t> pub_, replay_;  // used by the thread only, once it runs
  int wake_fd_ = -1;                             // eventfd: Publish and the destructor signal it

  std::deque<Buffered> buffer_;  // the thread's: the last buffer_steps batches, oldest first

  mutable std::mutex mu_;
  std::condition_variable idle_;
  std::deque<Pending> queue_;
  bool busy_ = false;  // the thread holds batches taken from queue_
  bool stop_ = false;
  ZmqKvEventPublisherStats stats_;
  std::thread thread_;
};

// What kAuto does with an endpoint before trying: true for the endpoints vLLM binds too
// (wildcards, ipc://, inproc://), for which a failed bind is never retried as a connect.
bool KvEventEndpointAlwaysBinds(std::string_view endpoint);

}  // namespace kvs
