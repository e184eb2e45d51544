// HTTP/1.1 requests and responses as the server's handlers see them: the head already parsed
// and checked, the body de-framed (Content-Length or chunked) and decoded (Content-Encoding),
// each within the limits of Limits.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace kvs::server::http {

struct Header {
  std::string name;  // lower-cased
  std::string value;
};

// What one request may cost the server before it is refused.
struct Limits {
  size_t max_head_bytes = 16 << 10;  // request line + headers (431 beyond)
  size_t max_headers = 100;          // header fields (431 beyond)
  size_t max_body_bytes = 8 << 20;   // the body after de-framing and decompression (413 beyond)
};

struct Request {
  std::string method;     // "GET", "POST", ...
  std::string path;       // "/v1/completions" (the target without its query)
  std::string query;      // after '?', undecoded
  int minor_version = 1;  // HTTP/1.<minor>
  std::vector<Header> headers;
  std::string body;

  // The value of a header (name in lower case), or nullptr.
  const std::string* Find(std::string_view name) const {
    for (const Header& h : headers) {
      if (h.name == name) return &h.value;
    }
    return nullptr;
  }
  std::string Get(std::string_view name) const {
    const std::string* v = Find(name);
    return v ? *v : std::string();
  }
};

// Writes a streamed body, from the handler's thread.
class BodyWriter {
 public:
  virtual ~BodyWriter() = default;
  // False when the client is gone, the server is stopping, or the deadline has passed.
  virtual bool Write(std::string_view data) = 0;
  // The rest of the body must be written by `deadline` (else Write fails and the connection is
  // closed). Any thread may call it.
  virtual void SetDeadline(std::chrono::steady_clock::time_point deadline) = 0;
};

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<Header> headers;  // more header fields
  // A streamed body (sent chunked; to HTTP/1.0 clients, until the connection closes): called on
  // the handler's thread once the head is out; returns when the body is complete or the writer
  // has failed.
  std::function<void(BodyWriter&)> stream;
};

// Header values compare case-insensitively, less surrounding spaces and tabs.
std::string AsciiLower(std::string_view s);
std::string_view TrimBlanks(std::string_view s);

// "OK", "Not Found", ... ("Unknown" for a status without one here).
const char* ReasonPhrase(int status);

// How a body's end is marked.
constexpr long long kChunked = -1;     // Transfer-Encoding: chunked (HTTP/1.1)
constexpr long long kUntilClose = -2;  // the connection closes (HTTP/1.0 streaming)

// The status line and header fields, ending with the blank line; `body_bytes` is the
// Content-Length, or kChunked / kUntilClose.
std::string SerializeHead(const Response& res, bool keep_alive, long long body_bytes);

// A whole response with a Content-Length; without its body for a HEAD request.
std::string SerializeResponse(const Response& res, bool keep_alive, bool head_only = false);

// One chunk of a chunked body ("" gives the last chunk).
std::string Chunk(std::string_view data);

}  // namespace kvs::server::http
