// Error handling without exceptions on the hot path: a Status carries a one-line message,
// Expected<T> carries a value or that Status. Loaders and parsers return these; the CLI
// prints the message and exits non-zero.
#pragma once

#include <cstdio>
#include <string>
#include <utility>
#include <variant>

namespace kvs {

class Status {
 public:
  Status() = default;  // OK
  static Status Ok() { return Status(); }
  static Status Error(std::string message) {
    Status s;
    s.ok_ = false;
    s.message_ = std::move(message);
    return s;
  }
  bool ok() const { return ok_; }
  const std::string& message() const { return message_; }

 private:
  bool ok_ = true;
  std::string message_;
};

// printf-style message builder for error paths.
std::string StrFormat(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

template <typename T>
class Expected {
 public:
  Expected(T value) : v_(std::move(value)) {}       // NOLINT: implicit by design
  Expected(Status error) : v_(std::move(error)) {}  // NOLINT
  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }
  T& value() & { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  const T& value() const& { return std::get<0>(v_); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<1>(v_);
  }
  const std::string& error() const { return status().message(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace kvs

#define KVS_CONCAT_INNER(a, b) a##b
#define KVS_CONCAT(a, b) KVS_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function when `expr` fails.
#define KVS_RETURN_IF_ERROR(expr) \
  do {                            \
    ::kvs::Status _st = (expr);   \
    if (!_st.ok()) return _st;    \
  } while (0)

// `KVS_ASSIGN_OR_RETURN(auto x, Foo());` unwraps an Expected or returns its Status.
#define KVS_ASSIGN_OR_RETURN(lhs, expr) \
  KVS_ASSIGN_OR_RETURN_IMPL(KVS_CONCAT(_exp_, __LINE__), lhs, expr)
#define KVS_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                              \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
