// The HTTP layer's request parser and body decoder on their own: framing, the attacks on it
// (smuggling, oversized heads and bodies, decompression bombs), pipelining.
#include <gtest/gtest.h>

#include <zlib.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "server/http/body_decoder.h"
#include "server/http/http_server.h"
#include "server/http/request_parser.h"

namespace kvs::server::http {
namespace {

using State = RequestParser::State;

// Parses `bytes` fed in pieces of `step` bytes, as a connection receives them; bytes not fed
// when the request is done are appended to *buf after it (as the next request's would be).
State ParseInSteps(RequestParser* p, std::string* buf, const std::string& bytes, size_t step) {
  State s = State::kNeedMore;
  size_t i = 0;
  for (; i < bytes.size() && s == State::kNeedMore; i += step) {
    buf->append(bytes, i, step);
    s = p->Parse(buf);
  }
  if (i < bytes.size()) buf->append(bytes, i);
  return s;
}

TEST(RequestParser, ParsesHeadAndLengthBodyByteByByte) {
  RequestParser p(Limits{});
  std::string buf;
  const std::string req =
      "POST /v1/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
      "Content-Length: 11\r\nX-Pad:   spaced value \t\r\n\r\n{\"prompt\":1}";
  ASSERT_EQ(ParseInSteps(&p, &buf, req, 1), State::kDone);
  EXPECT_EQ(p.request().method, "POST");
  EXPECT_EQ(p.request().path, "/v1/completions");
  EXPECT_EQ(p.request().query, "x=1");
  EXPECT_EQ(p.request().body, "{\"prompt\":1");  // 11 bytes; the 12th is the next request's
  EXPECT_EQ(p.request().Get("x-pad"), "spaced value");
  EXPECT_TRUE(p.keep_alive());
  EXPECT_EQ(buf, "}");
}

TEST(RequestParser, PipelinedRequestsStayInTheBuffer) {
  RequestParser p(Limits{});
  std::string buf =
      "GET /health HTTP/1.1\r\n\r\nGET /metrics HTTP/1.1\r\nConnection: close\r\n\r\n";
  ASSERT_EQ(p.Parse(&buf), State::kDone);
  EXPECT_EQ(p.request().path, "/health");
  p.Reset();
  ASSERT_EQ(p.Parse(&buf), State::kDone);
  EXPECT_EQ(p.request().path, "/metrics");
  EXPECT_FALSE(p.keep_alive());
  EXPECT_TRUE(buf.empty());
}

TEST(RequestParser, ChunkedBodyWithExtensionsAndTrailers) {
  RequestParser p(Limits{});
  std::string buf;
  const std::string req =
      "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n";
  ASSERT_EQ(ParseInSteps(&p, &buf, req, 3), State::kDone);
  EXPECT_EQ(p.request().body, "hello world");
  EXPECT_TRUE(buf.empty());
}

// The error status the parser gives for a whole request.
int StatusOf(const std::string& req, Limits limits = {}) {
  RequestParser p(limits);
  std::string buf = req;
  const State s = p.Parse(&buf);
  return s == State::kError ? p.error_status() : (s == State::kDone ? 200 : 0);
}

TEST(RequestParser, RefusesSmugglingAndMalformedFraming) {
  // Both framings, or two lengths: a proxy and the server could read different requests.
  EXPECT_EQ(StatusOf("POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"),
            400);
  EXPECT_EQ(StatusOf("POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd"), 400);
  EXPECT_EQ(StatusOf("POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc"), 200);
  EXPECT_EQ(StatusOf("POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n"), 400);
  EXPECT_EQ(StatusOf("POST / HTTP/1.1\r\nContent-Length: 1e3\r\n\r\n"), 400);
  EXPECT_EQ(StatusOf("POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n"), 400);
  EXPECT_EQ(StatusOf("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"), 501);
  EXPECT_EQ(StatusOf("POST / HTTP/1.1\r\nHost: a\r\n\r\n"), 200);  // no length: no body
  EXPECT_EQ(StatusOf("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"), 400);
  EXPECT_EQ(StatusOf("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX"), 400);
  EXPECT_EQ(StatusOf("GET / HTTP/1.1\r\n folded: x\r\n\r\n"), 400);
  EXPECT_EQ(StatusOf("GET / HTTP/1.1\r\nBad Name: x\r\n\r\n"), 400);
  EXPECT_EQ(StatusOf("GET / HTTP/1.1\r\nX: a\x01z\r\n\r\n"), 400);
  EXPECT_EQ(StatusOf("GET /a b HTTP/1.1\r\n\r\n"), 400);
  EXPECT_EQ(StatusOf("GET nopath HTTP/1.1\r\n\r\n"), 400);
  EXPECT_EQ(StatusOf("GET / HTTP/2.0\r\n\r\n"), 505);
  EXPECT_EQ(StatusOf("GET / JUNK/1.1\r\n\r\n"), 400);
  EXPECT_EQ(StatusOf("GET / HTTP/1.1\r\nExpect: 200-ok\r\n\r\n"), 417);
  EXPECT_EQ(StatusOf("GET http://example/v1/models HTTP/1.1\r\n\r\n"), 200);
}

TEST(RequestParser, LimitsAreCheckedBeforeBuffering) {
  Limits small;
  small.max_head_bytes = 256;
  small.max_headers = 4;
  small.max_body_bytes = 100;
  // A head that never ends is refused once it passes the limit, not when it ends.
  RequestParser p(small);
  std::string buf = "GET / HTTP/1.1\r\nX: " + std::string(300, 'a');
  EXPECT_EQ(p.Parse(&buf), State::kError);
  EXPECT_EQ(p.error_status(), 431);
  std::string many = "GET / HTTP/1.1\r\n";
  for (int i = 0; i < 5; ++i) {
    // Appended piece by piece: "X" + to_string(i) trips a false -Wrestrict in GCC 12.
    many += "X";
    many += std::to_string(i);
    many += ": y\r\n";
  }
  EXPECT_EQ(StatusOf(many + "\r\n", small), 431);
  // A declared length over the limit is refused from the head alone.
  EXPECT_EQ(StatusOf("POST / HTTP/1.1\r\nContent-Length: 101\r\n\r\n", small), 413);
  // Chunked: refused at the chunk that would pass it.
  EXPECT_EQ(StatusOf("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n60\r\n" +
                         std::string(96, 'a') + "\r\n10\r\n",
                     small),
            413);
}

TEST(RequestParser, KeepAliveFollowsVersionAndConnection) {
  RequestParser p(Limits{});
  std::string b1 = "GET / HTTP/1.0\r\n\r\n";
  ASSERT_EQ(p.Parse(&b1), State::kDone);
  EXPECT_FALSE(p.keep_alive());
  p.Reset();
  std::string b2 = "GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n";
  ASSERT_EQ(p.Parse(&b2), State::kDone);
  EXPECT_TRUE(p.keep_alive());
  p.Reset();
  std::string b3 = "GET / HTTP/1.1\r\nConnection: foo, Close\r\n\r\n";
  ASSERT_EQ(p.Parse(&b3), State::kDone);
  EXPECT_FALSE(p.keep_alive());
}

TEST(RequestParser, ExpectContinueIsReportedUntilSent) {
  RequestParser p(Limits{});
  std::string buf = "POST / HTTP/1.1\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n";
  ASSERT_EQ(p.Parse(&buf), State::kNeedMore);
  EXPECT_TRUE(p.wants_continue());
  EXPECT_EQ(p.body_reservation(), 3u);
  p.set_continue_sent();
  EXPECT_FALSE(p.wants_continue());
  buf = "abc";
  ASSERT_EQ(p.Parse(&buf), State::kDone);
  EXPECT_EQ(p.request().body, "abc");
}

std::string Compress(const std::string& data, int window_bits) {
  z_stream zs{};
  deflateInit2(&zs, 1, Z_DEFLATED, window_bits, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&zs, data.size()), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

Request Encoded(const std::string& coding, std::string body) {
  Request r;
  r.headers.push_back({"content-encoding", coding});
  r.body = std::move(body);
  return r;
}

TEST(BodyDecoder, InflatesGzipAndDeflate) {
  const std::string text = "{\"prompt\": \"Once upon a time\"}";
  Request gz = Encoded("gzip", Compress(text, 16 + MAX_WBITS));
  EXPECT_EQ(DecodeBody(&gz, 1 << 20).status, 0);
  EXPECT_EQ(gz.body, text);
  Request zl = Encoded("Deflate", Compress(text, MAX_WBITS));
  EXPECT_EQ(DecodeBody(&zl, 1 << 20).status, 0);
  EXPECT_EQ(zl.body, text);
  Request plain = Encoded("identity", text);
  EXPECT_EQ(DecodeBody(&plain, 1 << 20).status, 0);
  EXPECT_EQ(plain.body, text);
}

TEST(BodyDecoder, RefusesBombsCorruptAndUnknownCodings) {
  // 64 MiB of zeros compress to ~64 KiB; with a 1 MiB limit inflation stops at the limit.
  Request bomb = Encoded("gzip", Compress(std::string(64 << 20, '\0'), 16 + MAX_WBITS));
  EXPECT_LT(bomb.body.size(), 1u << 20);
  const DecodeError e = DecodeBody(&bomb, 1 << 20);
  EXPECT_EQ(e.status, 413);
  EXPECT_NE(e.message.find("decompressed"), std::string::npos);
  EXPECT_TRUE(bomb.body.empty());
  std::string cut = Compress("hello hello hello", 16 + MAX_WBITS);
  cut.resize(cut.size() / 2);
  Request truncated = Encoded("gzip", cut);
  EXPECT_EQ(DecodeBody(&truncated, 1 << 20).status, 400);
  Request garbage = Encoded("gzip", "not gzip at all");
  EXPECT_EQ(DecodeBody(&garbage, 1 << 20).status, 400);
  Request trailing = Encoded("gzip", Compress("x", 16 + MAX_WBITS) + "junk");
  EXPECT_EQ(DecodeBody(&trailing, 1 << 20).status, 400);
  Request br = Encoded("br", "....");
  EXPECT_EQ(DecodeBody(&br, 1 << 20).status, 415);
}

// Requests that arrive together are handled together: 32 handlers must all be running at once
// (each waits for the others), so the pool must grow as fast as requests are dispatched.
TEST(HttpServer, HandlersStartAsRequestsArrive) {
  constexpr int kRequests = 32;
  std::mutex mu;
  std::condition_variable cv;
  int inside = 0;
  HttpServerOptions o;
  o.worker_threads = kRequests + 8;
  HttpServer server(
      o,
      [&](Request&, Response& res) {
        std::unique_lock<std::mutex> lock(mu);
        ++inside;
        cv.notify_all();
        const bool all =
            cv.wait_for(lock, std::chrono::seconds(5), [&] { return inside == kRequests; });
        res.body = all ? "together" : "queued";
      },
      [](int status, const std::string& message) {
        Response res;
        res.status = status;
        res.body = message;
        return res;
      });
  auto port = server.Listen();
  ASSERT_TRUE(port.ok()) << port.error();
  std::vector<int> fds;
  for (int i = 0; i < kRequests; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(*port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    fds.push_back(fd);
  }
  const std::string request = "GET / HTTP/1.1\r\nConnection: close\r\n\r\n";
  for (int fd : fds)
    ASSERT_EQ(send(fd, request.data(), request.size(), 0), ssize_t(request.size()));
  for (int fd : fds) {
    std::string reply;
    char buf[512];
    ssize_t n;
    while ((n = recv(fd, buf, sizeof(buf), 0)) > 0) reply.append(buf, static_cast<size_t>(n));
    close(fd);
    EXPECT_NE(reply.find("together"), std::string::npos) << reply;
  }
  server.Stop(std::chrono::milliseconds(100));
}

}  // namespace
}  // namespace kvs::server::http
