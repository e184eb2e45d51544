#include "core/digest.h"

#include <xxhash.h>

#include <cstdio>

namespace kvs {

std::string Digest128::Hex() const {
  char buf[33];
  std::snprintf(buf, sizeof(buf), "%016llx%016llx", static_cast<unsigned long long>(hi),
                static_cast<unsigned long long>(lo));
  return buf;
}

Digest128 DigestBytes(const void* data, size_t n) {
  const XXH128_hash_t h = XXH3_128bits(data, n);
  return Digest128{h.low64, h.high64};
}

DigestBuilder::DigestBuilder() : state_(XXH3_createState()) {
  XXH3_128bits_reset(static_cast<XXH3_state_t*>(state_));
}

DigestBuilder::~DigestBuilder() {
  XXH3_freeState(static_cast<XXH3_state_t*>(state_));
}

DigestBuilder& DigestBuilder::Bytes(const void* data, size_t n) {
  const uint64_t len = n;
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), &len, sizeof(len));
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), data, n);
  return *this;
}

DigestBuilder& DigestBuilder::Int(int64_t v) {
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), &v, sizeof(v));
  return *this;
}

DigestBuilder& DigestBuilder::Add(const Digest128& d) {
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), &d.lo, sizeof(d.lo));
  XXH3_128bits_update(static_cast<XXH3_state_t*>(state_), &d.hi, sizeof(d.hi));
  return *this;
}

Digest128 DigestBuilder::Finish() const {
  const XXH128_hash_t h = XXH3_128bits_digest(static_cast<XXH3_state_t*>(state_));
  return Digest128{h.low64, h.high64};
}

}  // namespace kvs
