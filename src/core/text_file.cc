#include "core/text_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace kvs {

const char* FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISFIFO(mode)) return "a FIFO (pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

namespace {

std::string Size(int64_t bytes) {
  if (bytes >= (int64_t{1} << 20)) return StrFormat("%.1f MiB", bytes / double(1 << 20));
  return StrFormat("%lld bytes", static_cast<long long>(bytes));
}

// Closes the descriptor on every return path.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

}  // namespace

Expected<std::string> ReadTextFile(const std::string& path, int64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer before fstat
  // could refuse it. Checking the open descriptor, not the path, leaves no window for the
  // path to change in between.
  Fd f{open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK)};
  if (f.fd < 0) return Status::Error("cannot read '" + path + "': " + std::strerror(errno));
  struct stat st;
  if (fstat(f.fd, &st) != 0) {
    return Status::Error("cannot read '" + path + "': " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) {
    return Status::Error(
        StrFormat("'%s' is %s, not a regular file", path.c_str(), FileKind(st.st_mode)));
  }
  if (st.st_size > max_bytes) {
    return Status::Error(StrFormat("'%s' is %s, more than the %s limit on input files",
                                   path.c_str(), Size(st.st_size).c_str(),
                                   Size(max_bytes).c_str()));
  }
  // Read until end of file rather than trusting st_size: files in /proc and /sys report 0, and
  // a file may grow while it is read. One byte past the limit tells a file that is too big.
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = read(f.fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::Error("cannot read '" + path + "': " + std::strerror(errno));
    }
    if (n == 0) break;
    if (static_cast<int64_t>(text.size()) + n > max_bytes) {
      return Status::Error(StrFormat("'%s' is more than the %s limit on input files", path.c_str(),
                                     Size(max_bytes).c_str()));
    }
    text.append(buf, static_cast<size_t>(n));
  }
  return text;
}

}  // namespace kvs
