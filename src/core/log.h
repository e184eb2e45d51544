// Minimal leveled logging to stderr. The level is a process-wide setting chosen by the CLI.
#pragma once

namespace kvs {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
void Log(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace kvs

#define KVS_LOG_INFO(...) ::kvs::Log(::kvs::LogLevel::kInfo, __VA_ARGS__)
#define KVS_LOG_WARN(...) ::kvs::Log(::kvs::LogLevel::kWarn, __VA_ARGS__)
#define KVS_LOG_ERROR(...) ::kvs::Log(::kvs::LogLevel::kError, __VA_ARGS__)
#define KVS_LOG_DEBUG(...) ::kvs::Log(::kvs::LogLevel::kDebug, __VA_ARGS__)
