// 128-bit content digests (XXH3-128): the weights of a model, a KV format, calibration text.
// Not cryptographic: they tell apart files and formats that differ, they do not defend against
// someone forging a collision.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvs {

struct Digest128 {
  uint64_t lo = 0, hi = 0;
  bool operator==(const Digest128&) const = default;
  bool empty() const { return lo == 0 && hi == 0; }
  std::string Hex() const;  // 32 lowercase hex digits, high half first
};

Digest128 DigestBytes(const void* data, size_t n);

// Feeds fields one after another; each is length-prefixed where its length varies, so that no
// two different field lists give the same byte stream.
class DigestBuilder {
 public:
  DigestBuilder();
  ~DigestBuilder();
  DigestBuilder(const DigestBuilder&) = delete;
  DigestBuilder& operator=(const DigestBuilder&) = delete;

  DigestBuilder& Bytes(const void* data, size_t n);  // length-prefixed
  DigestBuilder& Text(std::string_view s) { return Bytes(s.data(), s.size()); }
  DigestBuilder& Int(int64_t v);
  DigestBuilder& Add(const Digest128& d);
  Digest128 Finish() const;

 private:
  void* state_;  // XXH3_state_t
};

}  // namespace kvs
