// Undoes a request body's Content-Encoding (gzip, deflate) with a limit on the decoded size
// that is enforced while inflating: a kilobyte that would expand to a gigabyte (a
// "decompression bomb") is refused once it passes the limit, never held whole in memory.
#pragma once

#include <cstddef>
#include <string>

#include "server/http/http_message.h"

namespace kvs::server::http {

struct DecodeError {
  int status = 0;  // 0: no error; else 400, 413 or 415
  std::string message;
};

// Replaces request->body by its decoded form per its Content-Encoding header (identity and
// absent leave it as is). On failure the body is left cleared and the error says why.
DecodeError DecodeBody(Request* request, size_t max_decoded_bytes);

}  // namespace kvs::server::http
