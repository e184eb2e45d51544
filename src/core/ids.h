// Strong ids: a block id, a sequence id, a token count and a kernel-block index are all plain
// integers, and passing one where another is meant used to compile. Each id is its own type,
// built only explicitly (BlockId{3}) and read through .value where arithmetic needs the number
// (slots, kernel-block indices, per-block arrays).
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>

namespace kvs {

template <typename Tag, typename Rep>
struct StrongId {
  Rep value{};

  constexpr StrongId() = default;
  constexpr explicit StrongId(Rep v) : value(v) {}
  constexpr auto operator<=>(const StrongId&) const = default;
};

using BlockId = StrongId<struct BlockIdTag, int32_t>;  // a KV block of the pool
using SeqId = StrongId<struct SeqIdTag, int64_t>;      // a sequence (one choice of a request)

}  // namespace kvs

template <typename Tag, typename Rep>
struct std::hash<kvs::StrongId<Tag, Rep>> {
  size_t operator()(const kvs::StrongId<Tag, Rep>& id) const noexcept {
    return std::hash<Rep>{}(id.value);
  }
};
