// Reading a whole input file (a prompt, a perplexity text) without trusting the path: a user's
// -f may name a device, a FIFO or a directory, or a file far larger than any prompt.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "core/status.h"

namespace kvs {

// The whole of a regular file of at most max_bytes. Anything else is an error with a one-line
// message naming the path: a directory, a device (/dev/zero would never end), a FIFO or socket
// (reading one waits for a writer), a file over max_bytes, or one that cannot be opened or read.
Expected<std::string> ReadTextFile(const std::string& path, int64_t max_bytes);

// What a st_mode that is not a regular file is, for messages: "a directory", "a FIFO (pipe)"...
const char* FileKind(mode_t mode);

}  // namespace kvs
