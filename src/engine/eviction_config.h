// Token eviction's settings (issue #19): a per-sequence KV budget, the guards, how often to evict
// and by which policy. The flags are --kv-budget, --kv-sink, --kv-window, --evict-every and
// --evict-policy; a request may set its own budget (the request field kv_budget).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"
#include "kv/eviction_policy.h"

namespace kvs {

// Positions a sequence keeps: N, or N% of its current length. Never below sink + window.
struct KvBudget {
  int32_t value = 0;  // 0: unset (no eviction)
  bool percent = false;
  int32_t tenths = 0;  // a percentage's tenths: 12.5% is value 12, tenths 5

  bool active() const { return value > 0 || (percent && tenths > 0); }
  // The positions kept by a sequence of `length` positions: at least sink + window.
  int32_t For(int32_t length, const EvictionGuard& guard) const;
  std::string ToString() const;  // "1024" or "25%"
};

// "1024", "25%" -> a budget; "0" or "" is unset. Negative, non-numeric, over 100% or a budget
// below sink + window (an absolute one) are errors naming `what` (the flag or field).
Expected<KvBudget> ParseKvBudget(std::string_view text, const EvictionGuard& guard,
                                 std::string_view what = "--kv-budget");

// The policy the fidelity table (README, "Token eviction") found best: the --evict-policy default.
inline constexpr char kDefaultEvictPolicy[] = "streaming";

struct EvictionConfig {
  KvBudget budget;                           // --kv-budget: the default of every request
  EvictionGuard guard;                       // --kv-sink, --kv-window
  std::string policy = kDefaultEvictPolicy;  // --evict-policy
  // --evict-every: evict every N decode steps (once over the budget); 0: when the sequence has
  // grown one block past its budget, so that each eviction frees a whole block.
  int32_t every = 0;

  Status Validate() const;
};

}  // namespace kvs
