#include "server/http/http_message.h"

#include <cctype>
#include <cstdio>

namespace kvs::server::http {

std::string AsciiLower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view TrimBlanks(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

const char* ReasonPhrase(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 411:
      return "Length Required";
    case 413:
      return "Content Too Large";
    case 415:
      return "Unsupported Media Type";
    case 417:
      return "Expectation Failed";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Unknown";
  }
}

std::string SerializeHead(const Response& res, bool keep_alive, long long body_bytes) {
  std::string head = "HTTP/1.1 " + std::to_string(res.status) + " " + ReasonPhrase(res.status) +
                     "\r\nContent-Type: " + res.content_type + "\r\n";
  if (body_bytes == kChunked) {
    head += "Transfer-Encoding: chunked\r\n";
  } else if (body_bytes >= 0) {
    head += "Content-Length: " + std::to_string(body_bytes) + "\r\n";
  }
  head += keep_alive ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
  for (const Header& h : res.headers) head += h.name + ": " + h.value + "\r\n";
  head += "\r\n";
  return head;
}

std::string SerializeResponse(const Response& res, bool keep_alive, bool head_only) {
  std::string out = SerializeHead(res, keep_alive, static_cast<long long>(res.body.size()));
  if (!head_only) out += res.body;
  return out;
}

std::string Chunk(std::string_view data) {
  char size[24];
  std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
  std::string out = size;
  out.append(data);
  out += "\r\n";
  return out;
}

}  // namespace kvs::server::http
