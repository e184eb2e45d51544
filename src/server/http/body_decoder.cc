#include "server/http/body_decoder.h"

#include <zlib.h>

namespace kvs::server::http {
namespace {

// Inflates `in` (zlib's window_bits chooses gzip, zlib or raw deflate) into *out, stopping with
// 413 as soon as the output would pass `limit`.
DecodeError Inflate(const std::string& in, int window_bits, size_t limit, std::string* out) {
  z_stream zs{};
  if (inflateInit2(&zs, window_bits) != Z_OK) return {500, "Cannot start decompression."};
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = static_cast<uInt>(in.size());  // bodies are at most a few MiB
  char chunk[64 << 10];
  DecodeError err;
  int rc = Z_OK;
  while (rc != Z_STREAM_END) {
    zs.next_out = reinterpret_cast<Bytef*>(chunk);
    zs.avail_out = sizeof(chunk);
    rc = inflate(&zs, Z_NO_FLUSH);
    if (rc != Z_OK && rc != Z_STREAM_END) {
      err = {400, "The request body is not valid for its Content-Encoding."};
      break;
    }
    const size_t produced = sizeof(chunk) - zs.avail_out;
    if (out->size() + produced > limit) {
      err = {413, "The request body is too large once decompressed (more than " +
                      std::to_string(limit) + " bytes)."};
      break;
    }
    out->append(chunk, produced);
    if (rc == Z_OK && produced == 0 && zs.avail_in == 0) {
      err = {400, "The request body ends inside its compressed stream."};
      break;
    }
  }
  inflateEnd(&zs);
  if (err.status == 0 && zs.avail_in != 0) {
    err = {400, "The request body has bytes after its compressed stream."};
  }
  return err;
}

}  // namespace

DecodeError DecodeBody(Request* request, size_t max_decoded_bytes) {
  const std::string* header = request->Find("content-encoding");
  if (!header) return {};
  const std::string coding = AsciiLower(TrimBlanks(*header));
  if (coding.empty() || coding == "identity") return {};
  int window_bits = 0;
  if (coding == "gzip" || coding == "x-gzip") {
    window_bits = 16 + MAX_WBITS;
  } else if (coding == "deflate") {
    window_bits = 32 + MAX_WBITS;  // zlib-wrapped, as RFC 9110 says (gzip headers accepted too)
  } else {
    request->body.clear();
    return {415, "Content-Encoding '" + *header + "' is not supported (gzip, deflate, identity)."};
  }
  std::string decoded;
  DecodeError err = Inflate(request->body, window_bits, max_decoded_bytes, &decoded);
  request->body = err.status == 0 ? std::move(decoded) : std::string();
  return err;
}

}  // namespace kvs::server::http
