// The server against hostile clients (issue #16's findings, one regression test each): raw
// sockets that drip, stall, lie about lengths, bomb with compression, or never read; the
// server must keep serving health checks and real clients, bound its memory, and stop in
// bounded time. Deadlines are shortened so that each test runs in seconds.
#include <gtest/gtest.h>

#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <fstream>
#include <future>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/openai_server.h"
#include "testing/test_models.h"

namespace kvs::server {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

// A blocking loopback connection whose reads give up after `timeout`; a small `receive_buffer`
// makes a client that reads slowly (or never) stall the server's writes sooner.
int Connect(int port, std::chrono::milliseconds timeout = 5000ms, int receive_buffer = 0) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (receive_buffer > 0) {
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &receive_buffer, sizeof(receive_buffer));
  }
  timeval tv{static_cast<time_t>(timeout.count() / 1000),
             static_cast<suseconds_t>(timeout.count() % 1000 * 1000)};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

// Reads until the server closes, the read times out, or `until` appears.
std::string ReadReply(int fd, const std::string& until = "") {
  std::string out;
  char buf[4096];
  while (true) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (!until.empty() && out.find(until) != std::string::npos) break;
  }
  return out;
}

int StatusOf(const std::string& reply) {
  return reply.rfind("HTTP/1.1 ", 0) == 0 ? std::atoi(reply.c_str() + 9) : 0;
}

// One raw exchange on a fresh connection.
std::string RawCall(int port, const std::string& request) {
  const int fd = Connect(port);
  SendAll(fd, request);
  std::string reply = ReadReply(fd);
  close(fd);
  return reply;
}

// gzip of `data` repeated `times` times (a bomb never needs the whole input in memory).
std::string Gzip(const std::string& data, size_t times = 1) {
  z_stream zs{};
  deflateInit2(&zs, 9, Z_DEFLATED, 16 + MAX_WBITS, 9, Z_DEFAULT_STRATEGY);
  std::string out;
  char chunk[1 << 16];
  for (size_t i = 0; i < times; ++i) {
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
    zs.avail_in = static_cast<uInt>(data.size());
    const int flush = i + 1 == times ? Z_FINISH : Z_NO_FLUSH;
    do {
      zs.next_out = reinterpret_cast<Bytef*>(chunk);
      zs.avail_out = sizeof(chunk);
      deflate(&zs, flush);
      out.append(chunk, sizeof(chunk) - zs.avail_out);
    } while (zs.avail_out == 0);
  }
  deflateEnd(&zs);
  return out;
}

// Under AddressSanitizer freed memory sits in its quarantine, so the growth of resident memory
// says nothing there about what the server keeps: the checks compare it in the release build.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kRssMeaningful = false;
#else
constexpr bool kRssMeaningful = true;
#endif

// This process's resident memory (the server runs in it), in bytes.
int64_t RssBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

class HostileTest : public ::testing::Test {
 protected:
  void Start(ServerOptions o = {}) {
    const std::string path = testing::TestModelPath("stories260K.gguf");
    if (path.empty()) GTEST_SKIP() << "stories260K.gguf not found (set KVSERVE_TEST_MODELS)";
    o.model_path = path;
    o.port = 0;
    o.engine.threads = 2;
    if (o.engine.n_ctx == 4096) o.engine.n_ctx = 512;
    server_ = std::make_unique<Server>(o);
    auto port = server_->Listen();
    ASSERT_TRUE(port.ok()) << port.error();
    port_ = *port;
    const Status loaded = server_->Load();
    ASSERT_TRUE(loaded.ok()) << loaded.message();
  }
  void TearDown() override {
    for (int fd : held_) close(fd);
    if (server_) server_->Stop();
  }
  // A client that must be answered promptly: two seconds, where a starved server takes 30+.
  std::unique_ptr<httplib::Client> Client() {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port_);
    c->set_connection_timeout(2, 0);
    c->set_read_timeout(2, 0);
    return c;
  }
  // Opens n connections that send the start of a head and then stall.
  void OpenSlowConnections(int n) {
    for (int i = 0; i < n; ++i) {
      const int fd = Connect(port_);
      ASSERT_GE(fd, 0);
      SendAll(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Drip: ");
      held_.push_back(fd);
    }
  }

  std::unique_ptr<Server> server_;
  int port_ = 0;
  std::vector<int> held_;
};

TEST_F(HostileTest, DecompressionBombGets413WithoutGrowingMemory) {
  Start();
  const std::string bomb = Gzip(std::string(1 << 20, '\0'), 512);  // 512 MiB once inflated
  ASSERT_LT(bomb.size(), 2u << 20);
  const int64_t before = RssBytes();
  const std::string reply =
      RawCall(port_,
              "POST /v1/completions HTTP/1.1\r\nContent-Type: application/json\r\n"
              "Content-Encoding: gzip\r\nContent-Length: " +
                  std::to_string(bomb.size()) + "\r\n\r\n" + bomb);
  EXPECT_EQ(StatusOf(reply), 413) << reply.substr(0, 200);
  EXPECT_NE(reply.find("decompressed"), std::string::npos);
  EXPECT_NE(reply.find("\"error\""), std::string::npos);  // OpenAI-shaped
  // The limit (8 MiB) bounds what inflating may take; 512 MiB would show.
  if (kRssMeaningful) {
    EXPECT_LT(RssBytes() - before, int64_t{48} << 20);
  }
  // A real compressed request still works.
  const std::string body = Gzip(R"({"prompt":"Once upon a time","max_tokens":2})");
  EXPECT_EQ(StatusOf(RawCall(port_,
                             "POST /v1/completions HTTP/1.1\r\nContent-Encoding: gzip\r\n"
                             "Connection: close\r\nContent-Length: " +
                                 std::to_string(body.size()) + "\r\n\r\n" + body)),
            200);
}

TEST_F(HostileTest, SlowConnectionsDoNotStarveHealthOrCompletions) {
  ServerOptions o;
  o.engine.n_parallel = 4;
  o.max_queue = 0;  // the audit's case: 12 slow connections locked everyone out
  o.header_timeout = 1500ms;
  Start(o);
  OpenSlowConnections(300);
  auto client = Client();
  auto health = client->Get("/health");
  ASSERT_TRUE(health) << "health starved by slow connections";
  EXPECT_EQ(health->status, 200);
  auto done = client->Post("/v1/completions", R"({"prompt":"Once upon a time","max_tokens":4})",
                           "application/json");
  ASSERT_TRUE(done) << "completion starved by slow connections";
  EXPECT_EQ(done->status, 200) << done->body;
  // Each slow connection is answered 408 and closed once its head is late.
  for (int fd : {held_.front(), held_.back()}) {
    const std::string reply = ReadReply(fd);  // ends when the server closes
    EXPECT_EQ(StatusOf(reply), 408) << reply;
  }
}

TEST_F(HostileTest, ConnectionCapEvictsTheStalestAndKeepsServing) {
  ServerOptions o;
  o.max_connections = 64;
  Start(o);
  OpenSlowConnections(200);
  auto health = Client()->Get("/health");
  ASSERT_TRUE(health) << "no room for a health check";
  EXPECT_EQ(health->status, 200);
  // The first slow connections were closed to make room, and /metrics counts them.
  EXPECT_EQ(ReadReply(held_[0]), "");
  auto metrics = Client()->Get("/metrics");
  ASSERT_TRUE(metrics);
  const size_t at = metrics->body.find("\nkvserve:http_connections_evicted_total ");
  ASSERT_NE(at, std::string::npos);
  EXPECT_GE(std::stod(metrics->body.substr(at + 41)), 1.0);
}

TEST_F(HostileTest, LateBodiesAndIdleConnectionsAreClosed) {
  ServerOptions o;
  o.body_timeout = 300ms;
  o.idle_timeout = 300ms;
  Start(o);
  // A body that stops arriving: 408 once its deadline passes.
  const int late = Connect(port_);
  SendAll(late, "POST /v1/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"pro");
  held_.push_back(late);
  const std::string reply = ReadReply(late);
  EXPECT_EQ(StatusOf(reply), 408) << reply;
  // An idle keep-alive connection is closed after its response.
  const int idle = Connect(port_);
  held_.push_back(idle);
  SendAll(idle, "GET /health HTTP/1.1\r\n\r\n");
  const std::string answered = ReadReply(idle);  // the answer, then the close
  EXPECT_EQ(StatusOf(answered), 200);
  EXPECT_NE(answered.find("keep-alive"), std::string::npos);
}

TEST_F(HostileTest, MissingOrBadLengthIsAnsweredAtOnce) {
  ServerOptions o;
  o.header_timeout = 60s;  // the answer must not wait for any deadline
  o.body_timeout = 60s;
  Start(o);
  const auto t0 = std::chrono::steady_clock::now();
  // No length: no body (RFC 9112), which /v1/completions refuses as it refuses any empty body.
  EXPECT_EQ(StatusOf(RawCall(
                port_, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")),
            400);
  // A body sent without a length is not read as the next request (here, one that would answer
  // 200): one reply, naming the missing body, and the connection closes (not a timeout).
  const std::string unframed = RawCall(
      port_, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\n\r\n");
  EXPECT_EQ(StatusOf(unframed), 400) << unframed;
  EXPECT_NE(unframed.find("no body"), std::string::npos) << unframed;
  EXPECT_NE(unframed.find("Connection: close"), std::string::npos) << unframed;
  size_t replies = 0;
  for (size_t at = unframed.find("HTTP/1.1 "); at != std::string::npos;
       at = unframed.find("HTTP/1.1 ", at + 1)) {
    ++replies;
  }
  EXPECT_EQ(replies, 1u) << unframed;
  EXPECT_EQ(
      StatusOf(RawCall(port_, "POST /v1/completions HTTP/1.1\r\nContent-Length: abc\r\n\r\n")),
      400);
  EXPECT_EQ(StatusOf(RawCall(port_,
                             "POST /v1/completions HTTP/1.1\r\nContent-Length: 999999999"
                             "\r\n\r\n")),
            413);
  // The sockets read with a 5 s timeout: all three answered well before one expired.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
}

TEST_F(HostileTest, StopIsBoundedWhateverTheClientsDo) {
  ServerOptions o;
  o.engine.n_ctx = 1024;
  o.shutdown_grace = 300ms;
  Start(o);
  OpenSlowConnections(100);
  // A streamed request whose client never reads: ~6 MB of chunks, more than the socket
  // buffers hold, so the handler's writes stall.
  const int stalled = Connect(port_, 200ms, /*receive_buffer=*/4096);
  ASSERT_GE(stalled, 0);
  held_.push_back(stalled);
  const std::string body = R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":700,)"
                           R"("n":4,"stream":true,"ignore_eos":true,"logprobs":true,)"
                           R"("top_logprobs":20})";
  SendAll(stalled, "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: " +
                       std::to_string(body.size()) + "\r\n\r\n" + body);
  // The engine finishes the request; its response is then stuck in the handler's writes.
  const auto give_up = std::chrono::steady_clock::now() + 120s;
  while (server_->stats().running + server_->stats().waiting > 0 || server_->stats().steps == 0) {
    ASSERT_LT(std::chrono::steady_clock::now(), give_up);
    std::this_thread::sleep_for(10ms);
  }
  auto stopped = std::async(std::launch::async, [this] { server_->Stop(); });
  ASSERT_EQ(stopped.wait_for(10s), std::future_status::ready) << "Stop hung";
  // The response was cut, not completed: its last chunk never came.
  const std::string got = ReadReply(stalled);
  EXPECT_EQ(StatusOf(got), 200);
  EXPECT_GT(got.size(), 0u);
  EXPECT_EQ(got.find("[DONE]"), std::string::npos);
}

TEST_F(HostileTest, SecondServerOnATakenPortFails) {
  Start();
  ServerOptions o;
  o.model_path = "unused.gguf";
  o.port = port_;
  Server second(o);
  auto port = second.Listen();
  ASSERT_FALSE(port.ok()) << "two servers share port " << port_;
  EXPECT_NE(port.error().find("in use"), std::string::npos) << port.error();
}

TEST_F(HostileTest, RangeIsIgnoredAndErrorsNameTheirParameter) {
  ServerOptions o;
  o.engine.n_parallel = 2;
  Start(o);
  auto client = Client();
  auto models = client->Get("/v1/models", {{"Range", "bytes=0-3"}});
  ASSERT_TRUE(models);
  EXPECT_EQ(models->status, 200);
  EXPECT_TRUE(json::parse(models->body, nullptr, false).is_object());
  auto done = client->Post("/v1/completions", {{"Range", "bytes=0-3"}},
                           R"({"prompt":"Once","max_tokens":2})", "application/json");
  ASSERT_TRUE(done);
  EXPECT_EQ(done->status, 200);
  auto param = [&](const std::string& body) {
    auto r = client->Post("/v1/completions", body, "application/json");
    EXPECT_TRUE(r && r->status == 400);
    return r ? json::parse(r->body, nullptr, false)["error"]["param"] : json();
  };
  EXPECT_EQ(param(R"({"prompt":"x","n":3})"), "n");  // above -np 2
  EXPECT_EQ(param(R"({"prompt":[1,100000]})"), "prompt");
  EXPECT_EQ(param(R"({"prompt":"x","n":2,"max_tokens":100000,"logprobs":5})"), "logprobs");
}

TEST_F(HostileTest, StreamedLogprobsAreNotKept) {
  ServerOptions o;
  o.engine.n_ctx = 2048;
  o.engine.n_parallel = 2;
  Start(o);
  auto client = Client();
  client->set_read_timeout(120, 0);
  const json req = {{"messages", {{{"role", "user"}, {"content", "Tell a story"}}}},
                    {"n", 2},
                    {"max_tokens", 600},
                    {"ignore_eos", true},
                    {"logprobs", true},
                    {"top_logprobs", 20},
                    {"stream", true}};
  auto warm = client->Post("/v1/chat/completions", req.dump(), "application/json");
  ASSERT_TRUE(warm);
  const int64_t before = RssBytes();
  size_t entries = 0;
  std::string tail;
  httplib::Request r;
  r.method = "POST";
  r.path = "/v1/chat/completions";
  r.body = req.dump();
  r.set_header("Content-Type", "application/json");
  r.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    tail.append(data, n);
    size_t pos;
    while ((pos = tail.find("\"top_logprobs\":[{")) != std::string::npos) {
      ++entries;
      tail.erase(0, pos + 10);
    }
    if (tail.size() > 64) tail.erase(0, tail.size() - 64);
    return true;
  };
  auto res = client->send(r);
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(entries, 1200u);  // every token of both choices came with its alternatives
  // ~36 KB a token were kept before (40+ MiB here); now nothing of a token outlives its chunk.
  // (tests/serve_hostile_test.sh measures the issue's n 2 x 1,500 tokens on the process.)
  if (kRssMeaningful) {
    EXPECT_LT(RssBytes() - before, int64_t{8} << 20);
  }
  // Non-streamed, the same request is still served (in compact form).
  json plain = req;
  plain["stream"] = false;
  plain["max_tokens"] = 300;
  auto whole = client->Post("/v1/chat/completions", plain.dump(), "application/json");
  ASSERT_TRUE(whole);
  ASSERT_EQ(whole->status, 200);
  const json body = json::parse(whole->body);
  ASSERT_EQ(body["choices"][1]["logprobs"]["content"].size(), 300u);
  EXPECT_EQ(body["choices"][1]["logprobs"]["content"][7]["top_logprobs"].size(), 20u);
}

TEST_F(HostileTest, ChunkedGzipPipelinedAndExpectContinueRequestsWork) {
  Start();
  // A chunked body, in two chunks.
  const std::string body = R"({"prompt":"Once","max_tokens":2})";
  char hex[16];
  std::snprintf(hex, sizeof(hex), "%zx", body.size() - 5);
  const std::string chunked =
      "POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n" +
      body.substr(0, 5) + "\r\n" + hex + "\r\n" + body.substr(5) + "\r\n0\r\n\r\n";
  const int fd = Connect(port_);
  // Two requests in one write: both answered, in order, on one connection.
  SendAll(fd, chunked + "GET /health HTTP/1.1\r\nConnection: close\r\n\r\n");
  const std::string both = ReadReply(fd);
  close(fd);
  EXPECT_EQ(StatusOf(both), 200) << both;
  EXPECT_NE(both.find("text_completion"), std::string::npos);
  EXPECT_NE(both.find("{\"status\":\"ok\"}"), std::string::npos);
  // Expect: 100-continue gets its interim answer before the body is sent.
  const int fd2 = Connect(port_);
  SendAll(fd2,
          "POST /v1/completions HTTP/1.1\r\nConnection: close\r\nExpect: 100-continue\r\n"
          "Content-Length: " +
              std::to_string(body.size()) + "\r\n\r\n");
  EXPECT_EQ(ReadReply(fd2, "\r\n\r\n"), "HTTP/1.1 100 Continue\r\n\r\n");
  SendAll(fd2, body);
  EXPECT_EQ(StatusOf(ReadReply(fd2)), 200);
  close(fd2);
}

}  // namespace
}  // namespace kvs::server

namespace kvs::server {
namespace {

TEST_F(HostileTest, DeclaredLengthsCostNothingAndNeedTheKey) {
  ServerOptions o;
  o.api_key = "k";
  Start(o);
  // Without the key, a head that declares 8 MiB is refused before any body is read.
  EXPECT_EQ(StatusOf(RawCall(port_,
                             "POST /v1/completions HTTP/1.1\r\nContent-Length: 8388608"
                             "\r\n\r\n{")),
            401);
  EXPECT_EQ(StatusOf(RawCall(port_, "POST /nothing HTTP/1.1\r\nContent-Length: 8388608\r\n\r\n{")),
            404);
  // With it, 40 stalled 8 MiB declarations (320 MiB, over the 256 MiB budget) hold one byte
  // each: other requests are still served.
  for (int i = 0; i < 40; ++i) {
    const int fd = Connect(port_);
    SendAll(fd,
            "POST /v1/completions HTTP/1.1\r\nAuthorization: Bearer k\r\n"
            "Content-Length: 8388608\r\n\r\n{");
    held_.push_back(fd);
  }
  auto client = Client();
  auto done = client->Post("/v1/completions", {{"Authorization", "bearer k"}},  // any case
                           R"({"prompt":"Once","max_tokens":2})", "application/json");
  ASSERT_TRUE(done);
  EXPECT_EQ(done->status, 200) << done->body;
}

TEST_F(HostileTest, NestedJsonAndHugeEchoesAreRefusedCheaply) {
  Start();
  const int64_t before = RssBytes();
  // 8 MiB of '[' would be ~700 MB of JSON tree: refused while parsing, at depth 65.
  const std::string deep = Gzip(std::string(8 << 20, '['));
  const std::string reply = RawCall(port_,
                                    "POST /v1/completions HTTP/1.1\r\nConnection: close\r\n"
                                    "Content-Encoding: gzip\r\nContent-Length: " +
                                        std::to_string(deep.size()) + "\r\n\r\n" + deep);
  EXPECT_EQ(StatusOf(reply), 400) << reply;
  EXPECT_NE(reply.find("deeper than 64"), std::string::npos) << reply;
  if (kRssMeaningful) {
    EXPECT_LT(RssBytes() - before, int64_t{64} << 20);
  }
  // A 1 MiB model name is not echoed whole.
  const std::string body = json{{"model", std::string(1 << 20, 'm')}, {"prompt", "x"}}.dump();
  auto r = Client()->Post("/v1/completions", body, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404);
  EXPECT_LT(r->body.size(), 1024u);
}

TEST_F(HostileTest, SlowReaderLosesItsSeatOnceTheEngineIsDone) {
  ServerOptions o;
  o.engine.n_parallel = 1;
  o.max_queue = 0;
  o.write_timeout = 1000ms;
  o.socket_send_buffer = 16 << 10;  // so that the kernel cannot take the whole response
  Start(o);
  // ~1 MB of stream read at ~5 KB/s: it would hold the only seat for minutes.
  const int slow = Connect(port_, 100ms, /*receive_buffer=*/4096);
  ASSERT_GE(slow, 0);
  held_.push_back(slow);
  const std::string body = R"({"messages":[{"role":"user","content":"Hi"}],"max_tokens":400,)"
                           R"("stream":true,"ignore_eos":true,"logprobs":true,"top_logprobs":20})";
  SendAll(slow, "POST /v1/chat/completions HTTP/1.1\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\n\r\n" + body);
  std::atomic<bool> stop{false};
  std::string got;
  std::thread reader([&] {
    char buf[256];
    while (!stop) {
      const ssize_t n = recv(slow, buf, sizeof(buf), 0);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) break;
      if (n > 0) got.append(buf, static_cast<size_t>(n));
      std::this_thread::sleep_for(50ms);
    }
  });
  // The seat frees about --timeout after the engine finishes, not when the client has read.
  auto client = Client();
  int status = 0;
  const auto give_up = std::chrono::steady_clock::now() + 20s;
  while (status != 200 && std::chrono::steady_clock::now() < give_up) {
    auto r =
        client->Post("/v1/completions", R"({"prompt":"x","max_tokens":1})", "application/json");
    status = r ? r->status : 0;
    if (status != 200) std::this_thread::sleep_for(100ms);
  }
  stop = true;
  reader.join();
  EXPECT_EQ(status, 200) << "the slow reader kept the seat";
  EXPECT_EQ(got.find("[DONE]"), std::string::npos);  // its response was cut, not completed
  EXPECT_LT(got.size(), size_t{900} << 10);
}

TEST_F(HostileTest, RequestsArrivingTogetherAllStreamAtOnce) {
  // Handler threads start as requests need them: 4 long streams offered at once must all be
  // streaming before any ends (a pool that grew too slowly left some queued behind the others).
  ServerOptions o;
  o.engine.n_parallel = 4;
  o.engine.n_ctx = 4096;
  Start(o);
  // Streams of seconds each: one left queued would start only after another ended, long after
  // the 2 s the first chunk is given.
  const std::string body = R"({"prompt":"Once","max_tokens":4000,"stream":true,"ignore_eos":true})";
  std::vector<int> fds;
  for (int i = 0; i < 4; ++i) {
    const int fd = Connect(port_, 2s);
    ASSERT_GE(fd, 0);
    held_.push_back(fd);
    fds.push_back(fd);
  }
  for (int fd : fds) {
    SendAll(fd, "POST /v1/completions HTTP/1.1\r\nContent-Length: " + std::to_string(body.size()) +
                    "\r\n\r\n" + body);
  }
  for (int fd : fds) {
    const std::string first = ReadReply(fd, "data: {");
    EXPECT_NE(first.find("data: {"), std::string::npos) << "a stream never started";
    EXPECT_EQ(first.find("[DONE]"), std::string::npos);
  }
}

TEST_F(HostileTest, Http10StreamsWithoutChunksAndHeadHasNoBody) {
  Start();
  const std::string body = R"({"prompt":"Once","max_tokens":3,"stream":true})";
  const std::string reply = RawCall(port_, "POST /v1/completions HTTP/1.0\r\nContent-Length: " +
                                               std::to_string(body.size()) + "\r\n\r\n" + body);
  EXPECT_EQ(StatusOf(reply), 200) << reply;
  EXPECT_EQ(reply.find("Transfer-Encoding"), std::string::npos) << reply;
  EXPECT_NE(reply.find("Connection: close"), std::string::npos);
  EXPECT_NE(reply.find("\r\n\r\ndata: {"), std::string::npos) << reply;  // no chunk sizes
  EXPECT_NE(reply.find("data: [DONE]"), std::string::npos);
  // HEAD: the head of GET's answer, no body, and the connection stays usable.
  const int fd = Connect(port_);
  SendAll(fd, "HEAD /health HTTP/1.1\r\n\r\nGET /health HTTP/1.1\r\nConnection: close\r\n\r\n");
  const std::string two = ReadReply(fd);
  close(fd);
  EXPECT_EQ(StatusOf(two), 200);
  const size_t second = two.find("HTTP/1.1 200", 1);
  ASSERT_NE(second, std::string::npos) << two;
  EXPECT_EQ(two.substr(second - 4, 4), "\r\n\r\n");  // nothing between the two heads
  EXPECT_NE(two.find("{\"status\":\"ok\"}", second), std::string::npos);
}

}  // namespace
}  // namespace kvs::server
