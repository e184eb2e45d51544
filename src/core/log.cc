#include "core/log.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>

namespace kvs {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kWarn)};
}

void SetLogLevel(LogLevel level) {
  g_level.store(static_cast<int>(level));
}
LogLevel GetLogLevel() {
  return static_cast<LogLevel>(g_level.load());
}

void Log(LogLevel level, const char* fmt, ...) {
  if (static_cast<int>(level) > g_level.load()) return;
  static const char* kNames[] = {"error", "warn", "info", "debug"};
  std::fprintf(stderr, "[%s] ", kNames[static_cast<int>(level)]);
  va_list args;
  va_start(args, fmt);
  std::vfprintf(stderr, fmt, args);
  va_end(args);
  std::fputc('\n', stderr);
}

}  // namespace kvs
