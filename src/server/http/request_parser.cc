#include "server/http/request_parser.h"

#include <algorithm>
#include <cctype>

namespace kvs::server::http {
namespace {

// RFC 9110 token characters (method and header names).
bool IsTokenChar(unsigned char c) {
  return std::isalnum(c) || std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

bool IsToken(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return IsTokenChar(c); });
}

// Whether a comma-separated header value lists `token` (case-insensitive).
bool ListHas(std::string_view value, std::string_view token) {
  size_t start = 0;
  while (start <= value.size()) {
    size_t end = value.find(',', start);
    if (end == std::string_view::npos) end = value.size();
    if (AsciiLower(TrimBlanks(value.substr(start, end - start))) == token) return true;
    start = end + 1;
  }
  return false;
}

// The end of the next line at or after `from` (the index of its '\n'), or npos.
size_t LineEnd(const std::string& buf, size_t from) {
  return buf.find('\n', from);
}

// A line without its terminator ("\r\n" or a bare "\n").
std::string_view LineAt(const std::string& buf, size_t from, size_t newline) {
  std::string_view line(buf.data() + from, newline - from);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  return line;
}

}  // namespace

void RequestParser::Reset() {
  *this = RequestParser(limits_);
}

RequestParser::State RequestParser::Fail(int status, std::string message) {
  error_status_ = status;
  error_message_ = std::move(message);
  keep_alive_ = false;  // the rest of the stream cannot be trusted to frame a next request
  return State::kError;
}

RequestParser::State RequestParser::Parse(std::string* buf) {
  if (error_status_ != 0) return State::kError;
  if (phase_ == Phase::kDone) return State::kDone;
  if (phase_ == Phase::kHead) {
    // Empty lines before a request line are ignored (RFC 9112 2.2), e.g. after a body's CRLF.
    size_t skip = 0;
    while (skip < buf->size() && ((*buf)[skip] == '\r' || (*buf)[skip] == '\n')) ++skip;
    if (skip > 0) {
      buf->erase(0, skip);
      head_scan_from_ = 0;
    }
    if (buf->empty()) return State::kNeedMore;
    started_ = true;
    // The head ends at the first empty line.
    size_t end = std::string::npos;
    for (size_t i = buf->find('\n', head_scan_from_); i != std::string::npos;
         i = buf->find('\n', i + 1)) {
      if (i + 1 < buf->size() && (*buf)[i + 1] == '\n') {
        end = i + 2;
        break;
      }
      if (i + 2 < buf->size() && (*buf)[i + 1] == '\r' && (*buf)[i + 2] == '\n') {
        end = i + 3;
        break;
      }
      if (i + 2 >= buf->size()) break;  // the terminator may still be arriving
    }
    if (end == std::string::npos) {
      if (buf->size() > limits_.max_head_bytes) {
        return Fail(431, "The request head is larger than " +
                             std::to_string(limits_.max_head_bytes) + " bytes.");
      }
      head_scan_from_ = buf->size() >= 2 ? buf->size() - 2 : 0;
      return State::kNeedMore;
    }
    if (end > limits_.max_head_bytes) {
      return Fail(431, "The request head is larger than " + std::to_string(limits_.max_head_bytes) +
                           " bytes.");
    }
    const State head = ParseHead(std::string_view(*buf).substr(0, end));
    buf->erase(0, end);
    if (head == State::kError) return head;
  }
  size_t pos = 0;
  State state = State::kNeedMore;
  if (phase_ == Phase::kLengthBody) {
    if (buf->size() >= content_length_) {
      request_.body.assign(*buf, 0, content_length_);
      pos = content_length_;
      phase_ = Phase::kDone;
    }
  } else if (phase_ != Phase::kDone) {
    state = ParseChunked(buf, &pos);
  }
  buf->erase(0, pos);
  if (state == State::kError) return state;
  if (phase_ == Phase::kDone) return State::kDone;
  return State::kNeedMore;
}

RequestParser::State RequestParser::ParseRequestLine(std::string_view line) {
  const size_t sp1 = line.find(' ');
  const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos) {
    return Fail(400, "Malformed request line.");
  }
  const std::string_view method = line.substr(0, sp1);
  std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  const std::string_view version = line.substr(sp2 + 1);
  if (!IsToken(method)) return Fail(400, "Malformed request method.");
  if (version.size() != 8 || version.substr(0, 5) != "HTTP/" || !std::isdigit(version[5]) ||
      version[6] != '.' || !std::isdigit(version[7])) {
    return Fail(400, "Malformed HTTP version.");
  }
  if (version[5] != '1') return Fail(505, "Only HTTP/1.0 and HTTP/1.1 are served.");
  request_.minor_version = version[7] - '0';
  for (unsigned char c : target) {
    if (c <= 0x20 || c == 0x7f) return Fail(400, "Malformed request target.");
  }
  // Absolute form (sent to proxies, allowed to servers): keep the path.
  if (target.size() > 7 && AsciiLower(target.substr(0, 7)) == "http://") {
    const size_t slash = target.find('/', 7);
    target = slash == std::string_view::npos ? std::string_view("/") : target.substr(slash);
  }
  if (target.empty() || (target[0] != '/' && target != "*")) {
    return Fail(400, "Malformed request target.");
  }
  request_.method = std::string(method);
  const size_t q = target.find('?');
  request_.path = std::string(target.substr(0, q));
  if (q != std::string_view::npos) request_.query = std::string(target.substr(q + 1));
  return State::kNeedMore;
}

RequestParser::State RequestParser::ParseHead(std::string_view head) {
  size_t nl = head.find('\n');
  std::string_view line = head.substr(0, nl);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (ParseRequestLine(line) == State::kError) return State::kError;
  size_t from = nl + 1;
  while (from < head.size()) {
    nl = head.find('\n', from);
    line = head.substr(from, nl - from);
    from = nl + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) break;
    if (line[0] == ' ' || line[0] == '\t') return Fail(400, "Folded header lines are not allowed.");
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos || !IsToken(line.substr(0, colon))) {
      return Fail(400, "Malformed header field.");
    }
    const std::string_view value = TrimBlanks(line.substr(colon + 1));
    for (unsigned char c : value) {
      if ((c < 0x20 && c != '\t') || c == 0x7f) return Fail(400, "Malformed header value.");
    }
    if (request_.headers.size() >= limits_.max_headers) {
      return Fail(431, "More than " + std::to_string(limits_.max_headers) + " header fields.");
    }
    request_.headers.push_back({AsciiLower(line.substr(0, colon)), std::string(value)});
  }

  // Framing. Content-Length and Transfer-Encoding together, or Content-Lengths that differ,
  // are how requests are smuggled past proxies: refuse them.
  std::string transfer_encoding;
  bool has_length = false;
  for (const Header& h : request_.headers) {
    if (h.name == "transfer-encoding") {
      transfer_encoding += (transfer_encoding.empty() ? "" : ",") + h.value;
    } else if (h.name == "content-length") {
      if (h.value.empty() || h.value.size() > 18 ||
          !std::all_of(h.value.begin(), h.value.end(), [](char c) { return std::isdigit(c); })) {
        return Fail(400, "Malformed Content-Length.");
      }
      const uint64_t n = std::stoull(h.value);
      if (has_length && n != content_length_) return Fail(400, "Conflicting Content-Length.");
      has_length = true;
      content_length_ = n;
    } else if (h.name == "connection") {
      if (ListHas(h.value, "close")) keep_alive_ = false;
      if (request_.minor_version == 0 && !ListHas(h.value, "keep-alive")) keep_alive_ = false;
    } else if (h.name == "expect") {
      if (AsciiLower(h.value) != "100-continue") return Fail(417, "Only 'Expect: 100-continue'.");
      expect_continue_ = request_.minor_version >= 1;  // HTTP/1.0 has no interim responses
    }
  }
  if (request_.minor_version == 0 && !request_.Find("connection")) keep_alive_ = false;
  if (!transfer_encoding.empty()) {
    if (has_length) return Fail(400, "Both Content-Length and Transfer-Encoding.");
    if (AsciiLower(TrimBlanks(transfer_encoding)) != "chunked" || request_.minor_version == 0) {
      return Fail(501, "Transfer-Encoding '" + transfer_encoding + "' is not supported.");
    }
    phase_ = Phase::kChunkSize;
    body_reservation_ = limits_.max_body_bytes;
    return State::kNeedMore;
  }
  // Neither length nor chunked: no body (RFC 9112 6.3), also for a POST: `curl -X POST
  // .../reset_prefix_cache`, as vLLM's docs write it, sends none. An endpoint that needs a body
  // answers 400 for the empty one. A client that meant to send a body anyway would have its
  // bytes read as the next request: the connection closes after the reply instead.
  if (!has_length) {
    content_length_ = 0;
    if (request_.method == "POST" || request_.method == "PUT" || request_.method == "PATCH") {
      keep_alive_ = false;
    }
  }
  if (content_length_ > limits_.max_body_bytes) {
    return Fail(413, "The request body is too large (more than " +
                         std::to_string(limits_.max_body_bytes) + " bytes).");
  }
  body_reservation_ = content_length_;
  if (content_length_ == 0) expect_continue_ = false;
  phase_ = content_length_ == 0 ? Phase::kDone : Phase::kLengthBody;
  return State::kNeedMore;
}

RequestParser::State RequestParser::ParseChunked(std::string* buf, size_t* pos) {
  constexpr size_t kMaxChunkLine = 4096;  // size, extensions, CRLF
  while (true) {
    switch (phase_) {
      case Phase::kChunkSize: {
        const size_t nl = LineEnd(*buf, *pos);
        if (nl == std::string::npos) {
          if (buf->size() - *pos > kMaxChunkLine) return Fail(400, "Malformed chunk size.");
          return State::kNeedMore;
        }
        std::string_view line = LineAt(*buf, *pos, nl);
        line = line.substr(0, line.find(';'));  // chunk extensions are ignored
        line = TrimBlanks(line);
        if (line.empty() || line.size() > 15 ||
            !std::all_of(line.begin(), line.end(), [](char c) { return std::isxdigit(c); })) {
          return Fail(400, "Malformed chunk size.");
        }
        chunk_left_ = std::stoull(std::string(line), nullptr, 16);
        if (request_.body.size() + chunk_left_ > limits_.max_body_bytes) {
          return Fail(413, "The request body is too large (more than " +
                               std::to_string(limits_.max_body_bytes) + " bytes).");
        }
        *pos = nl + 1;
        phase_ = chunk_left_ == 0 ? Phase::kTrailers : Phase::kChunkData;
        break;
      }
      case Phase::kChunkData: {
        const size_t n = std::min<uint64_t>(chunk_left_, buf->size() - *pos);
        request_.body.append(*buf, *pos, n);
        *pos += n;
        chunk_left_ -= n;
        if (chunk_left_ > 0) return State::kNeedMore;
        phase_ = Phase::kChunkDataEnd;
        break;
      }
      case Phase::kChunkDataEnd: {
        // The data must be followed by CRLF (or a bare LF) at once.
        if (*pos < buf->size() && (*buf)[*pos] != '\r' && (*buf)[*pos] != '\n') {
          return Fail(400, "Malformed chunk end.");
        }
        const size_t nl = LineEnd(*buf, *pos);
        if (nl == std::string::npos) {
          if (buf->size() - *pos > 1) return Fail(400, "Malformed chunk end.");
          return State::kNeedMore;
        }
        if (!LineAt(*buf, *pos, nl).empty()) return Fail(400, "Malformed chunk end.");
        *pos = nl + 1;
        phase_ = Phase::kChunkSize;
        break;
      }
      case Phase::kTrailers: {
        const size_t nl = LineEnd(*buf, *pos);
        if (nl == std::string::npos) {
          if (trailer_bytes_ + buf->size() - *pos > limits_.max_head_bytes) {
            return Fail(431, "The request's trailer fields are too large.");
          }
          return State::kNeedMore;
        }
        trailer_bytes_ += nl + 1 - *pos;
        if (trailer_bytes_ > limits_.max_head_bytes) {
          return Fail(431, "The request's trailer fields are too large.");
        }
        const bool last = LineAt(*buf, *pos, nl).empty();
        *pos = nl + 1;
        if (last) {  // trailer fields themselves are dropped: nothing here reads them
          phase_ = Phase::kDone;
          return State::kDone;
        }
        break;
      }
      default:
        return State::kDone;
    }
  }
}

}  // namespace kvs::server::http
