// A redis-server of the test's own on a free loopback port (no persistence), started and killed
// by the test: for the shared KV tier's tests (issue #22). ok() is false where redis-server is
// not installed; tests then skip with why().
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

namespace kvs::testing {

class RedisServer {
 public:
  explicit RedisServer(std::vector<std::string> extra_args = {}) : extra_(std::move(extra_args)) {
    binary_ = Which("redis-server");
    if (binary_.empty()) {
      why_ = "redis-server not found (scripts/setup.sh installs it)";
      return;
    }
    port_ = FreePort();
    Start();
  }
  ~RedisServer() { Kill(); }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  bool ok() const { return pid_ > 0; }
  const std::string& why() const { return why_; }
  int port() const { return port_; }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }

  // kill -9, as a crash would.
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  // (Re)starts it on the same port and waits (10 s at most) until it answers PING.
  bool Start() {
    Kill();
    std::vector<std::string> args = {
        binary_,        "--port", std::to_string(port_), "--bind", "127.0.0.1",  "--save", "",
        "--appendonly", "no",     "--daemonize",         "no",     "--loglevel", "warning"};
    args.insert(args.end(), extra_.begin(), extra_.end());
    pid_ = ::fork();
    if (pid_ == 0) {
      std::vector<char*> argv;
      for (std::string& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      const int null_fd = ::open("/dev/null", O_WRONLY);
      if (null_fd >= 0) ::dup2(null_fd, 1);
      ::execv(binary_.c_str(), argv.data());
      ::_exit(127);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      redisContext* c = redisConnect("127.0.0.1", port_);
      const bool up = c && !c->err;
      if (c) redisFree(c);
      if (up) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));  // a poll, not a wait
    }
    why_ = "redis-server did not answer on port " + std::to_string(port_);
    Kill();
    return false;
  }

  // Runs a command on a fresh connection (password: AUTH first); the reply, or null.
  redisReply* Command(const std::vector<std::string>& args, const std::string& password = "") {
    redisContext* c = redisConnect("127.0.0.1", port_);
    if (!c || c->err) {
      if (c) redisFree(c);
      return nullptr;
    }
    if (!password.empty()) {
      freeReplyObject(redisCommand(c, "AUTH %s", password.c_str()));
    }
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const std::string& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    auto* r = static_cast<redisReply*>(
        redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data()));
    redisFree(c);
    return r;
  }

  static int FreePort() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    socklen_t len = sizeof addr;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
    ::close(fd);
    return ntohs(addr.sin_port);
  }

 private:
  static std::string Which(const std::string& name) {
    const char* path = std::getenv("PATH");
    std::string dirs = path ? path : "/usr/bin:/bin";
    dirs += ":/usr/sbin:/sbin";
    size_t start = 0;
    while (start <= dirs.size()) {
      const size_t end = dirs.find(':', start);
      const std::string dir = dirs.substr(start, end == std::string::npos ? end : end - start);
      const std::string candidate = dir + "/" + name;
      if (!dir.empty() && ::access(candidate.c_str(), X_OK) == 0) return candidate;
      if (end == std::string::npos) break;
      start = end + 1;
    }
    return "";
  }

  std::string binary_;
  std::vector<std::string> extra_;
  std::string why_;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace kvs::testing
