// KV events (kv/kv_events.h, kv/zmq_event_publisher.h; issue #22): the msgpack bytes of each
// event type, checked byte for byte and field by field with msgpack-cxx's own decoder; then the
// ZeroMQ publisher against real SUB, DEALER and REQ sockets on loopback TCP: sequence numbers,
// replay, malformed replay requests, drops on a full queue, errors naming the endpoint, a
// shutdown that does not wait for absent subscribers. Waits poll sockets with deadlines.
#include <gtest/gtest.h>
#include <msgpack.hpp>

#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "kv/block_store.h"
#include "kv/kv_events.h"
#include "kv/zmq_event_publisher.h"

namespace kvs {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
constexpr auto kDeadline = std::chrono::seconds(20);  // generous: a shared 2-core machine

std::string Hex(std::span<const uint8_t> bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string s;
  for (uint8_t b : bytes) {
    s += kDigits[b >> 4];
    s += kDigits[b & 15];
  }
  return s;
}

uint64_t BigEndian64(const void* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = v << 8 | static_cast<const uint8_t*>(p)[i];
  return v;
}

std::string Seq8(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (56 - 8 * i));
  return s;
}

KvBlockStored Stored(uint64_t first, int n_blocks, std::optional<BlockHash> parent = {}) {
  KvBlockStored e;
  for (int i = 0; i < n_blocks; ++i) e.hashes.push_back(BlockHash{first + i, ~(first + i)});
  e.parent = parent;
  e.block_size = 4;
  for (int i = 0; i < 4 * n_blocks; ++i) e.token_ids.push_back(static_cast<int32_t>(first * 7 + i));
  e.medium = kKvMediumCpu;
  return e;
}

// ---- encoding ----------------------------------------------------------------------------------

TEST(KvEvents, HashBytesAreBlockHashHexBigEndian) {
  const BlockHash h{0x0102030405060708ull, 0xf1f2f3f4f5f6f7f8ull};
  EXPECT_EQ(Hex(KvEventHashBytes(h)), "f1f2f3f4f5f6f7f80102030405060708");
  EXPECT_EQ(Hex(KvEventHashBytes(h)), BlockHashHex(h));
}

TEST(KvEvents, EncodesAllBlocksClearedBatchExactly) {
  const std::vector<KvEvent> events = {KvAllBlocksCleared{}};
  // [1.5, [["AllBlocksCleared"]], 0]: float64, fixarray, fixstr of 16, positive fixint.
  EXPECT_EQ(Hex(EncodeKvEventBatch(1.5, events, 0)),
            "93cb3ff8000000000000"
            "9191b0416c6c426c6f636b73436c6561726564"
            "00");
}

TEST(KvEvents, EncodesStoredAndRemovedExactly) {
  KvBlockStored stored;
  stored.hashes = {BlockHash{0x0102030405060708ull, 0x1112131415161718ull}};
  stored.parent = BlockHash{2, 1};
  stored.token_ids = {1, 300};
  stored.block_size = 2;
  stored.medium = kKvMediumCpu;
  KvBlockRemoved removed;
  removed.hashes = {BlockHash{3, 0}};
  const std::vector<KvEvent> events = {stored, removed};
  // No rank: a 2-element batch. An integral ts stays a float64. Python's msgpack.packb(...,
  // use_bin_type=True) of the same lists gives these bytes.
  EXPECT_EQ(Hex(EncodeKvEventBatch(2.0, events, std::nullopt)),
            "92cb4000000000000000"
            "92"
            "97ab426c6f636b53746f726564"                  // ["BlockStored",
            "91c41011121314151617180102030405060708"      //  [hash],
            "c41000000000000000010000000000000002"        //  parent,
            "9201cd012c"                                  //  [1, 300],
            "02c0a3435055"                                //  2, nil, "CPU"]
            "93ac426c6f636b52656d6f766564"                // ["BlockRemoved",
            "91c41000000000000000000000000000000003c0");  //  [hash], nil]
}

// The fields as a third party reads them: msgpack-cxx's generic objects, not our decoder.
TEST(KvEvents, FieldsDecodeWithMsgpack) {
  const KvBlockStored stored = Stored(10, 2, BlockHash{9, ~uint64_t{9}});
  KvBlockRemoved removed;
  removed.hashes = {BlockHash{10, ~uint64_t{10}}};
  removed.medium = kKvMediumCpu;
  const std::vector<KvEvent> events = {stored, removed, KvAllBlocksCleared{}};
  const std::vector<uint8_t> bytes = EncodeKvEventBatch(1700000000.25, events, 7);
  msgpack::object_handle oh =
      msgpack::unpack(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  const msgpack::object& batch = oh.get();
  ASSERT_EQ(batch.type, msgpack::type::ARRAY);
  ASSERT_EQ(batch.via.array.size, 3u);
  EXPECT_EQ(batch.via.array.ptr[0].type, msgpack::type::FLOAT64);
  EXPECT_EQ(batch.via.array.ptr[0].as<double>(), 1700000000.25);
  EXPECT_EQ(batch.via.array.ptr[2].as<int>(), 7);
  const msgpack::object& evs = batch.via.array.ptr[1];
  ASSERT_EQ(evs.via.array.size, 3u);

  const msgpack::object& s = evs.via.array.ptr[0];
  ASSERT_EQ(s.via.array.size, 7u);
  EXPECT_EQ(s.via.array.ptr[0].as<std::string>(), "BlockStored");
  const msgpack::object& hashes = s.via.array.ptr[1];
  ASSERT_EQ(hashes.via.array.size, 2u);
  for (uint32_t i = 0; i < 2; ++i) {
    const msgpack::object& h = hashes.via.array.ptr[i];
    ASSERT_EQ(h.type, msgpack::type::BIN);
    ASSERT_EQ(h.via.bin.size, 16u);
    EXPECT_EQ(Hex({reinterpret_cast<const uint8_t*>(h.via.bin.ptr), 16}),
              BlockHashHex(stored.hashes[i]));
  }
  ASSERT_EQ(s.via.array.ptr[2].type, msgpack::type::BIN);
  EXPECT_EQ(Hex({reinterpret_cast<const uint8_t*>(s.via.array.ptr[2].via.bin.ptr), 16}),
            BlockHashHex(*stored.parent));
  EXPECT_EQ(s.via.array.ptr[3].as<std::vector<int32_t>>(), stored.token_ids);
  EXPECT_EQ(s.via.array.ptr[4].as<int>(), 4);
  EXPECT_TRUE(s.via.array.ptr[5].is_nil());  // lora_id
  EXPECT_EQ(s.via.array.ptr[6].as<std::string>(), "CPU");

  const msgpack::object& r = evs.via.array.ptr[1];
  ASSERT_EQ(r.via.array.size, 3u);
  EXPECT_EQ(r.via.array.ptr[0].as<std::string>(), "BlockRemoved");
  EXPECT_EQ(r.via.array.ptr[1].via.array.size, 1u);
  EXPECT_EQ(r.via.array.ptr[2].as<std::string>(), "CPU");

  const msgpack::object& c = evs.via.array.ptr[2];
  ASSERT_EQ(c.via.array.size, 1u);
  EXPECT_EQ(c.via.array.ptr[0].as<std::string>(), "AllBlocksCleared");
}

TEST(KvEvents, DecodeRoundTrips) {
  KvBlockStored big = Stored(1u << 20, 3);
  big.token_ids[0] = 151643;  // a Qwen-sized vocabulary: uint32 on the wire
  big.medium.reset();
  const std::vector<KvEvent> events = {big, KvBlockRemoved{{BlockHash{5, 6}}, kKvMediumCpu},
                                       KvAllBlocksCleared{}};
  for (std::optional<int32_t> rank : {std::optional<int32_t>(), std::optional<int32_t>(2)}) {
    auto batch = DecodeKvEventBatch(EncodeKvEventBatch(12.75, events, rank));
    ASSERT_TRUE(batch.ok()) << batch.error();
    EXPECT_EQ(*batch, (KvEventBatch{12.75, events, rank}));
  }
}

// What vLLM's publishers of other versions send: int hashes, a nil rank, BlockStored without a
// medium, or with fields past it.
TEST(KvEvents, DecodeAcceptsVllmVariants) {
  std::vector<uint8_t> out;
  struct Sink {
    std::vector<uint8_t>* out;
    void write(const char* p, size_t n) { out->insert(out->end(), p, p + n); }
  } sink{&out};
  msgpack::packer<Sink> pk(sink);
  pk.pack_array(3);
  pk.pack_double(3.0);
  pk.pack_array(3);
  pk.pack_array(6);  // older BlockStored: no medium
  pk.pack(std::string("BlockStored"));
  pk.pack(std::vector<uint64_t>{42, 43});
  pk.pack(uint64_t{41});
  pk.pack(std::vector<int>{1, 2, 3, 4});
  pk.pack(2);
  pk.pack_nil();
  pk.pack_array(9);  // newer BlockStored: lora_name, extra_keys
  pk.pack(std::string("BlockStored"));
  pk.pack(std::vector<uint64_t>{44});
  pk.pack_nil();
  pk.pack(std::vector<int>{5, 6});
  pk.pack(2);
  pk.pack_nil();
  pk.pack(std::string("GPU"));
  pk.pack_nil();
  pk.pack_nil();
  pk.pack_array(2);
  pk.pack(std::string("BlockRemoved"));
  pk.pack(std::vector<uint64_t>{42});
  pk.pack_nil();  // rank

  auto batch = DecodeKvEventBatch(out);
  ASSERT_TRUE(batch.ok()) << batch.error();
  EXPECT_FALSE(batch->dp_rank.has_value());
  ASSERT_EQ(batch->events.size(), 3u);
  const auto& a = std::get<KvBlockStored>(batch->events[0]);
  EXPECT_EQ(a.hashes, (std::vector<BlockHash>{{42, 0}, {43, 0}}));
  EXPECT_EQ(a.parent, (BlockHash{41, 0}));
  EXPECT_FALSE(a.medium.has_value());
  const auto& b = std::get<KvBlockStored>(batch->events[1]);
  EXPECT_EQ(b.token_ids, (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(b.medium, "GPU");
  EXPECT_EQ(std::get<KvBlockRemoved>(batch->events[2]).hashes, (std::vector<BlockHash>{{42, 0}}));
}

TEST(KvEvents, DecodeRejectsMalformedInputWithoutCrashing) {
  const std::vector<KvEvent> events = {Stored(1, 2)};
  const std::vector<uint8_t> good = EncodeKvEventBatch(1.0, events, 0);
  // Every truncation of a good batch is an error, never a crash.
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_FALSE(DecodeKvEventBatch(std::span(good).first(n)).ok()) << n;
  }
  std::vector<uint8_t> trailing = good;
  trailing.push_back(0xc0);
  EXPECT_FALSE(DecodeKvEventBatch(trailing).ok());
  auto hex = [](std::string_view h) {
    std::vector<uint8_t> v;
    for (size_t i = 0; i + 1 < h.size(); i += 2) {
      v.push_back(static_cast<uint8_t>(std::stoi(std::string(h.substr(i, 2)), nullptr, 16)));
    }
    return v;
  };
  EXPECT_FALSE(DecodeKvEventBatch(hex("c0")).ok());                              // nil
  EXPECT_FALSE(DecodeKvEventBatch(hex("91cb3ff0000000000000")).ok());            // [1.0]
  EXPECT_FALSE(DecodeKvEventBatch(hex("92cb3ff000000000000091a3466f6f")).ok());  // "Foo" event
  EXPECT_FALSE(DecodeKvEventBatch(hex("92cb3ff00000000000009192ac426c6f636b52656d6f76656491c4"
                                      "0f000000000000000000000000000000"))
                   .ok());  // a 15-byte hash
  // An array claiming 2^32 - 1 elements in 5 bytes: refused before anything is reserved.
  EXPECT_FALSE(DecodeKvEventBatch(hex("ddffffffff")).ok());
}

TEST(KvEventRecorder, KeepsBatchesInOrderAndSkipsEmptyOnes) {
  KvEventRecorder rec;
  rec.Publish({Stored(1, 1)});
  rec.Publish({});
  rec.Publish({KvBlockRemoved{{BlockHash{1, ~uint64_t{1}}}, kKvMediumCpu}, KvAllBlocksCleared{}});
  ASSERT_EQ(rec.batches().size(), 2u);
  ASSERT_EQ(rec.events().size(), 3u);
  EXPECT_EQ(rec.events()[0], KvEvent(Stored(1, 1)));
  EXPECT_EQ(rec.events()[2], KvEvent(KvAllBlocksCleared{}));
  rec.Clear();
  EXPECT_TRUE(rec.batches().empty());
}

// ---- the ZeroMQ publisher ----------------------------------------------------------------------

struct Message {
  std::vector<std::string> frames;
};

// A client socket of the test's own context, with a receive that polls up to a deadline.
class Client {
 public:
  Client(zmq::socket_type type, const std::string& endpoint, const std::string& topic = "")
      : socket_(ctx_, type) {
    socket_.set(zmq::sockopt::linger, 0);
    if (type == zmq::socket_type::sub) socket_.set(zmq::sockopt::subscribe, topic);
    socket_.connect(endpoint);
  }
  zmq::socket_t& socket() { return socket_; }
  void Send(const std::vector<std::string>& frames) {
    for (size_t i = 0; i < frames.size(); ++i) {
      socket_.send(zmq::buffer(frames[i]),
                   i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  }
  std::optional<Message> Receive(milliseconds timeout) {
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, timeout) <= 0) return std::nullopt;
    std::vector<zmq::message_t> parts;
    if (!zmq::recv_multipart(socket_, std::back_inserter(parts))) return std::nullopt;
    Message m;
    for (auto& p : parts) m.frames.push_back(p.to_string());
    return m;
  }

 private:
  zmq::context_t ctx_{1};
  zmq::socket_t socket_;
};

std::unique_ptr<ZmqKvEventPublisher> OpenOrDie(ZmqKvEventPublisherConfig config) {
  auto pub = ZmqKvEventPublisher::Open(std::move(config));
  EXPECT_TRUE(pub.ok()) << pub.error();
  return pub.ok() ? std::move(*pub) : nullptr;
}

ZmqKvEventPublisherConfig LoopbackConfig(bool replay) {
  ZmqKvEventPublisherConfig c;
  c.endpoint = "tcp://127.0.0.1:*";
  if (replay) c.replay_endpoint = "tcp://127.0.0.1:*";
  c.clock = [] { return 1234.5; };
  return c;
}

// A SUB socket misses what is published before its subscription reaches the publisher (ZeroMQ's
// slow joiner): publish probes until one arrives, then read up to the last probe sent. Returns
// that probe's seq.
uint64_t Join(ZmqKvEventPublisher& pub, Client& sub) {
  const auto deadline = Clock::now() + kDeadline;
  while (Clock::now() < deadline) {
    pub.Publish({KvAllBlocksCleared{}});
    if (auto m = sub.Receive(milliseconds(50))) {
      EXPECT_TRUE(pub.Flush(-1));
      const uint64_t last = pub.stats().next_seq - 1;
      for (uint64_t seq = BigEndian64(m->frames[1].data()); seq != last;) {
        m = sub.Receive(std::chrono::duration_cast<milliseconds>(kDeadline));
        if (!m) break;
        seq = BigEndian64(m->frames[1].data());
      }
      return last;
    }
  }
  ADD_FAILURE() << "the subscriber never received a probe";
  return 0;
}

KvEventBatch DecodeOrDie(const std::string& payload) {
  auto b = DecodeKvEventBatch({reinterpret_cast<const uint8_t*>(payload.data()), payload.size()});
  EXPECT_TRUE(b.ok()) << b.error();
  return b.ok() ? *b : KvEventBatch{};
}

TEST(ZmqKvEventPublisher, PublishesConsecutiveSequenceNumbersToASubscriber) {
  auto config = LoopbackConfig(false);
  config.topic = "kv@replica-a@stories260K";
  config.dp_rank = 3;
  auto pub = OpenOrDie(config);
  ASSERT_TRUE(pub);
  EXPECT_TRUE(pub->bound());
  EXPECT_NE(pub->endpoint(), "tcp://127.0.0.1:*");  // the port ZeroMQ picked
  Client sub(zmq::socket_type::sub, pub->endpoint(), config.topic);
  const uint64_t joined = Join(*pub, sub);

  constexpr int kBatches = 20;
  for (int i = 0; i < kBatches; ++i) pub->Publish({Stored(100 * i, 1 + i % 3)});
  for (int i = 0; i < kBatches; ++i) {
    auto m = sub.Receive(std::chrono::duration_cast<milliseconds>(kDeadline));
    ASSERT_TRUE(m) << "batch " << i;
    ASSERT_EQ(m->frames.size(), 3u);
    EXPECT_EQ(m->frames[0], config.topic);
    ASSERT_EQ(m->frames[1].size(), 8u);
    EXPECT_EQ(BigEndian64(m->frames[1].data()), joined + 1 + i);
    const KvEventBatch b = DecodeOrDie(m->frames[2]);
    EXPECT_EQ(b.ts, 1234.5);
    EXPECT_EQ(b.dp_rank, 3);
    ASSERT_EQ(b.events.size(), 1u);
    EXPECT_EQ(b.events[0], KvEvent(Stored(100 * i, 1 + i % 3)));
  }
  ASSERT_TRUE(pub->Flush(-1));
  const auto st = pub->stats();
  EXPECT_EQ(st.next_seq, joined + 1 + kBatches);
  EXPECT_EQ(st.batches_published, static_cast<int64_t>(st.next_seq));  // the first seq is 0
  EXPECT_EQ(st.batches_dropped, 0);
  EXPECT_EQ(st.send_errors, 0);
}

TEST(ZmqKvEventPublisher, ReplaysBufferedBatchesThenTheEndMarker) {
  auto config = LoopbackConfig(true);
  config.buffer_steps = 5;
  auto pub = OpenOrDie(config);
  ASSERT_TRUE(pub);
  for (int i = 0; i < 8; ++i) pub->Publish({Stored(i, 1)});  // seqs 0..7; 3..7 kept
  ASSERT_TRUE(pub->Flush(-1));
  const std::string kEnd = Seq8(~uint64_t{0});

  // A REQ socket (vLLM's example subscriber) reads the first answer of its request only.
  Client req(zmq::socket_type::req, pub->replay_endpoint());
  req.Send({Seq8(6)});
  auto m = req.Receive(std::chrono::duration_cast<milliseconds>(kDeadline));
  ASSERT_TRUE(m);
  ASSERT_EQ(m->frames.size(), 2u);
  EXPECT_EQ(BigEndian64(m->frames[0].data()), 6u);

  Client dealer(zmq::socket_type::dealer, pub->replay_endpoint());
  auto replay = [&](uint64_t from) {
    dealer.Send({"", Seq8(from)});
    std::vector<uint64_t> seqs;
    while (true) {
      auto m = dealer.Receive(std::chrono::duration_cast<milliseconds>(kDeadline));
      if (!m) {
        ADD_FAILURE() << "no end marker";
        return seqs;
      }
      EXPECT_EQ(m->frames.size(), 3u);
      EXPECT_EQ(m->frames[0], "");
      if (m->frames[1] == kEnd) {
        EXPECT_EQ(m->frames[2], "");
        return seqs;
      }
      const uint64_t seq = BigEndian64(m->frames[1].data());
      const KvEventBatch b = DecodeOrDie(m->frames[2]);
      EXPECT_EQ(b.events, (std::vector<KvEvent>{Stored(seq, 1)})) << seq;
      seqs.push_back(seq);
    }
  };
  EXPECT_EQ(replay(5), (std::vector<uint64_t>{5, 6, 7}));
  EXPECT_EQ(replay(0), (std::vector<uint64_t>{3, 4, 5, 6, 7}));  // older ones are gone
  EXPECT_EQ(replay(8), (std::vector<uint64_t>{}));

  // A DEALER without the empty delimiter frame is answered without it.
  Client bare(zmq::socket_type::dealer, pub->replay_endpoint());
  bare.Send({Seq8(7)});
  m = bare.Receive(std::chrono::duration_cast<milliseconds>(kDeadline));
  ASSERT_TRUE(m);
  ASSERT_EQ(m->frames.size(), 2u);
  EXPECT_EQ(BigEndian64(m->frames[0].data()), 7u);
  m = bare.Receive(std::chrono::duration_cast<milliseconds>(kDeadline));
  ASSERT_TRUE(m);
  EXPECT_EQ(m->frames, (std::vector<std::string>{kEnd, ""}));

  // Every request above has been answered to its end marker, which goes after the counts.
  EXPECT_EQ(pub->stats().replay_requests, 5);
  EXPECT_EQ(pub->stats().replay_batches, 3 + 5 + 0 + 1 + 2);
}

TEST(ZmqKvEventPublisher, IgnoresMalformedReplayRequestsAndKeepsWorking) {
  auto config = LoopbackConfig(true);
  auto pub = OpenOrDie(config);
  ASSERT_TRUE(pub);
  pub->Publish({Stored(1, 1)});
  ASSERT_TRUE(pub->Flush(-1));
  Client dealer(zmq::socket_type::dealer, pub->replay_endpoint());
  dealer.Send({"", "abcd"});        // 4 bytes
  dealer.Send({"", "123456789"});   // 9 bytes
  dealer.Send({"", ""});            // empty
  dealer.Send({"", Seq8(0), "x"});  // 4 frames at the ROUTER
  dealer.Send({"abcd"});            // bare, 4 bytes
  dealer.Send({"", Seq8(0)});       // well-formed
  auto m = dealer.Receive(std::chrono::duration_cast<milliseconds>(kDeadline));
  ASSERT_TRUE(m);
  ASSERT_EQ(m->frames.size(), 3u);
  EXPECT_EQ(BigEndian64(m->frames[1].data()), 0u);
  EXPECT_EQ(pub->stats().bad_replay_requests, 5);  // counted before the good one was read

  // Still publishing and answering.
  pub->Publish({Stored(2, 1)});
  ASSERT_TRUE(pub->Flush(-1));
  m = dealer.Receive(std::chrono::duration_cast<milliseconds>(kDeadline));  // the end marker
  ASSERT_TRUE(m);
  dealer.Send({"", Seq8(1)});
  m = dealer.Receive(std::chrono::duration_cast<milliseconds>(kDeadline));
  ASSERT_TRUE(m);
  EXPECT_EQ(BigEndian64(m->frames[1].data()), 1u);
  EXPECT_EQ(DecodeOrDie(m->frames[2]).events, (std::vector<KvEvent>{Stored(2, 1)}));
}

// Holds the publisher's thread in on_sent until opened.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  int entered = 0;
  void Enter() {
    std::unique_lock<std::mutex> lock(mu);
    ++entered;
    cv.notify_all();
    cv.wait(lock, [&] { return open; });
  }
  void WaitEntered(int n) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return entered >= n; });
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu);
    open = true;
    cv.notify_all();
  }
};

TEST(ZmqKvEventPublisher, FullQueueDropsAndCountsWithoutBlocking) {
  Gate gate;
  auto config = LoopbackConfig(true);
  config.max_queue = 4;
  config.on_sent = [&](uint64_t) { gate.Enter(); };
  auto pub = OpenOrDie(config);
  ASSERT_TRUE(pub);
  pub->Publish({Stored(0, 1)});  // seq 0: sent, then the thread waits at the gate
  gate.WaitEntered(1);
  for (int i = 1; i <= 4; ++i) pub->Publish({Stored(i, 1)});  // seqs 1..4: queued
  for (int i = 5; i <= 7; ++i) pub->Publish({Stored(i, 2)});  // seqs 5..7: dropped
  auto st = pub->stats();
  EXPECT_EQ(st.batches_dropped, 3);
  EXPECT_EQ(st.events_dropped, 3);
  EXPECT_EQ(st.next_seq, 8u);
  gate.Open();
  ASSERT_TRUE(pub->Flush(-1));
  pub->Publish({Stored(8, 1)});
  ASSERT_TRUE(pub->Flush(-1));
  st = pub->stats();
  EXPECT_EQ(st.batches_published, 6);
  EXPECT_EQ(st.batches_dropped, 3);

  // The dropped batches kept their numbers: a replay shows the gap.
  Client dealer(zmq::socket_type::dealer, pub->replay_endpoint());
  dealer.Send({"", Seq8(0)});
  std::vector<uint64_t> seqs;
  while (auto m = dealer.Receive(std::chrono::duration_cast<milliseconds>(kDeadline))) {
    if (m->frames[2].empty()) break;
    seqs.push_back(BigEndian64(m->frames[1].data()));
  }
  EXPECT_EQ(seqs, (std::vector<uint64_t>{0, 1, 2, 3, 4, 8}));
}

TEST(ZmqKvEventPublisher, ShutdownWithoutSubscribersReturnsPromptly) {
  // Bound with nobody subscribed, and connected to a port where nobody listens (messages wait
  // in ZeroMQ's queue for a peer that never comes: linger_ms bounds the wait).
  for (KvEventEndpointMode mode : {KvEventEndpointMode::kBind, KvEventEndpointMode::kConnect}) {
    auto config = LoopbackConfig(true);
    config.mode = mode;
    if (mode == KvEventEndpointMode::kConnect) config.endpoint = "tcp://127.0.0.1:1";
    config.linger_ms = 200;
    auto pub = OpenOrDie(config);
    ASSERT_TRUE(pub);
    EXPECT_EQ(pub->bound(), mode == KvEventEndpointMode::kBind);
    for (int i = 0; i < 1000; ++i) pub->Publish({Stored(i, 2)});
    // Destroyed on another thread so that a hang fails the test instead of stalling it.
    auto done = std::async(std::launch::async, [p = std::move(pub)]() mutable { p.reset(); });
    EXPECT_EQ(done.wait_for(std::chrono::seconds(10)), std::future_status::ready)
        << "shutdown hung (mode " << static_cast<int>(mode) << ")";
  }
}

TEST(ZmqKvEventPublisher, BadEndpointsAreErrorsNamingThem) {
  for (const char* endpoint : {"tcp://127.0.0.1:notaport", "nonsense", "udp://127.0.0.1:5557"}) {
    ZmqKvEventPublisherConfig config;
    config.endpoint = endpoint;
    auto pub = ZmqKvEventPublisher::Open(config);
    ASSERT_FALSE(pub.ok()) << endpoint;
    EXPECT_NE(pub.error().find(endpoint), std::string::npos) << pub.error();
  }
  // A port in use, for the PUB socket and for the replay socket.
  auto first = OpenOrDie(LoopbackConfig(true));
  ASSERT_TRUE(first);
  ZmqKvEventPublisherConfig config;
  config.endpoint = first->endpoint();
  auto taken = ZmqKvEventPublisher::Open(config);
  ASSERT_FALSE(taken.ok());
  EXPECT_NE(taken.error().find(first->endpoint()), std::string::npos) << taken.error();
  EXPECT_NE(taken.error().find("in use"), std::string::npos) << taken.error();
  config.endpoint = "tcp://127.0.0.1:*";
  config.replay_endpoint = first->replay_endpoint();
  taken = ZmqKvEventPublisher::Open(config);
  ASSERT_FALSE(taken.ok());
  EXPECT_NE(taken.error().find(first->replay_endpoint()), std::string::npos) << taken.error();

  config = ZmqKvEventPublisherConfig{};
  config.max_queue = 0;
  EXPECT_FALSE(ZmqKvEventPublisher::Open(config).ok());
}

// ZeroMQ would bind 99999 as 34463 and 0 as any port, silently: both flags refuse such ports,
// as --kv-redis does, naming the flag and the endpoint.
TEST(ZmqKvEventPublisher, PortsOutsideOneTo65535AreRefused) {
  for (const char* endpoint :
       {"tcp://127.0.0.1:99999", "tcp://127.0.0.1:0", "tcp://127.0.0.1:", "tcp://127.0.0.1",
        "tcp://[::1]:70000", "tcp://127.0.0.1:-1", "tcp://127.0.0.1:0005557x"}) {
    ZmqKvEventPublisherConfig config;
    config.endpoint = endpoint;
    auto pub = ZmqKvEventPublisher::Open(config);
    ASSERT_FALSE(pub.ok()) << endpoint;
    EXPECT_NE(pub.error().find(std::string("--kv-events ") + endpoint), std::string::npos)
        << pub.error();
    config.endpoint = "tcp://127.0.0.1:*";
    config.replay_endpoint = endpoint;
    pub = ZmqKvEventPublisher::Open(config);
    ASSERT_FALSE(pub.ok()) << endpoint;
    EXPECT_NE(pub.error().find(std::string("--kv-events-replay ") + endpoint), std::string::npos)
        << pub.error();
  }
}

TEST(ZmqKvEventPublisher, AutoModeBindsLocalAddressesAndConnectsOthers) {
  EXPECT_TRUE(KvEventEndpointAlwaysBinds("tcp://*:5557"));
  EXPECT_TRUE(KvEventEndpointAlwaysBinds("tcp://[::]:5557"));
  EXPECT_TRUE(KvEventEndpointAlwaysBinds("ipc:///tmp/kv-events"));
  EXPECT_TRUE(KvEventEndpointAlwaysBinds("inproc://kv"));
  EXPECT_FALSE(KvEventEndpointAlwaysBinds("tcp://127.0.0.1:5557"));

  auto local = OpenOrDie(LoopbackConfig(false));
  ASSERT_TRUE(local);
  EXPECT_TRUE(local->bound());
  auto config = LoopbackConfig(false);
  config.endpoint = "tcp://localhost:*";
  auto named = OpenOrDie(config);
  ASSERT_TRUE(named);
  EXPECT_TRUE(named->bound());
  EXPECT_TRUE(named->endpoint().starts_with("tcp://127.0.0.1:")) << named->endpoint();

  // A host name is no interface of this machine (bind: "No such device"): a router's address,
  // connected to. It does not resolve, so nothing answers.
  ZmqKvEventPublisherConfig remote;
  remote.endpoint = "tcp://kv-router.invalid:5557";
  remote.linger_ms = 0;
  auto pub = ZmqKvEventPublisher::Open(remote);
  ASSERT_TRUE(pub.ok()) << pub.error();
  EXPECT_FALSE((*pub)->bound());
  EXPECT_EQ((*pub)->endpoint(), remote.endpoint);
  // Another machine's address (bind: "Cannot assign requested address") is connected to the same
  // way; shown here with kBind only, whose error names it. A connection attempt could reach a
  // peer other than ZeroMQ (a sandbox's transparent proxy answers every address), and libzmq
  // 4.3.4 aborts when a PUB socket closes in the middle of such a handshake
  // (zmtp_engine.cpp:463).
  remote.endpoint = "tcp://203.0.113.77:5557";
  remote.mode = KvEventEndpointMode::kBind;
  auto refused = ZmqKvEventPublisher::Open(remote);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().find(remote.endpoint), std::string::npos) << refused.error();
  EXPECT_NE(refused.error().find("assign"), std::string::npos) << refused.error();
}

// llm-d's topology: the indexer binds, each engine connects its PUB socket to it.
TEST(ZmqKvEventPublisher, ConnectsToASubscriberThatBinds) {
  zmq::context_t ctx(1);
  zmq::socket_t sub(ctx, zmq::socket_type::sub);
  sub.set(zmq::sockopt::linger, 0);
  sub.set(zmq::sockopt::subscribe, "");
  sub.bind("tcp://127.0.0.1:*");
  auto config = LoopbackConfig(false);
  config.endpoint = sub.get(zmq::sockopt::last_endpoint);
  config.mode = KvEventEndpointMode::kConnect;
  auto pub = OpenOrDie(config);
  ASSERT_TRUE(pub);
  EXPECT_FALSE(pub->bound());
  const auto deadline = Clock::now() + kDeadline;
  bool received = false;
  while (!received && Clock::now() < deadline) {
    pub->Publish({Stored(1, 1)});
    zmq::pollitem_t item{sub.handle(), 0, ZMQ_POLLIN, 0};
    if (zmq::poll(&item, 1, milliseconds(50)) > 0) {
      std::vector<zmq::message_t> parts;
      ASSERT_TRUE(zmq::recv_multipart(sub, std::back_inserter(parts)));
      ASSERT_EQ(parts.size(), 3u);
      EXPECT_EQ(DecodeOrDie(parts[2].to_string()).events, (std::vector<KvEvent>{Stored(1, 1)}));
      received = true;
    }
  }
  EXPECT_TRUE(received);
}

}  // namespace
}  // namespace kvs
