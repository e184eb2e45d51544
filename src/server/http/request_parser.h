// An incremental HTTP/1.1 request parser: fed the bytes of a connection as they arrive, it
// finds the head, checks it (request line, header syntax, framing), then collects the body
// (Content-Length or chunked). Every size is checked as the bytes come, so a request that is
// too large is refused before it is buffered; malformed framing that proxies could read two
// ways (Content-Length with Transfer-Encoding, differing Content-Lengths) is refused outright.
// The body's Content-Encoding is not undone here (see body_decoder.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "server/http/http_message.h"

namespace kvs::server::http {

class RequestParser {
 public:
  enum class State { kNeedMore, kDone, kError };

  explicit RequestParser(const Limits& limits) : limits_(limits) {}

  // Parses from the front of *buf, erasing what it consumed (the bytes of a pipelined next
  // request stay). Call again with more bytes while it says kNeedMore.
  State Parse(std::string* buf);

  // For the next request on the same connection.
  void Reset();

  bool started() const { return started_; }  // some byte of this request has arrived
  bool head_done() const { return phase_ != Phase::kHead; }
  // The head asked "Expect: 100-continue" and the body has not started.
  bool wants_continue() const { return expect_continue_ && !continue_sent_; }
  void set_continue_sent() { continue_sent_ = true; }
  // Body bytes this request may still buffer (its Content-Length, or the limit if chunked).
  size_t body_reservation() const { return body_reservation_; }
  // The client asked to keep the connection open (HTTP/1.1 unless "close"; 1.0 if asked).
  bool keep_alive() const { return keep_alive_; }

  Request& request() { return request_; }
  int error_status() const { return error_status_; }
  const std::string& error_message() const { return error_message_; }

 private:
  enum class Phase { kHead, kLengthBody, kChunkSize, kChunkData, kChunkDataEnd, kTrailers, kDone };

  State Fail(int status, std::string message);
  State ParseHead(std::string_view head);
  State ParseRequestLine(std::string_view line);
  State ParseChunked(std::string* buf, size_t* pos);

  Limits limits_;
  Phase phase_ = Phase::kHead;
  Request request_;
  bool started_ = false;
  size_t head_scan_from_ = 0;  // where to resume looking for the end of the head
  uint64_t content_length_ = 0;
  uint64_t chunk_left_ = 0;
  bool expect_continue_ = false;
  bool continue_sent_ = false;
  size_t body_reservation_ = 0;
  bool keep_alive_ = true;
  size_t trailer_bytes_ = 0;
  int error_status_ = 0;
  std::string error_message_;
};

}  // namespace kvs::server::http
