#include "engine/eviction_config.h"

#include <algorithm>
#include <charconv>

namespace kvs {

int32_t KvBudget::For(int32_t length, const EvictionGuard& guard) const {
  // At least one position: a sequence always keeps its latest key.
  const int64_t floor = std::max<int64_t>(1, int64_t{guard.sink} + guard.window);
  int64_t kept = value;
  if (percent) kept = int64_t{length} * (int64_t{value} * 10 + tenths) / 1000;
  return static_cast<int32_t>(std::min<int64_t>(std::max(kept, floor), INT32_MAX));
}

std::string KvBudget::ToString() const {
  std::string text = std::to_string(value);
  if (!percent) return text;
  if (tenths != 0) text.append(".").append(std::to_string(tenths));
  return text.append("%");
}

Expected<KvBudget> ParseKvBudget(std::string_view text, const EvictionGuard& guard,
                                 std::string_view what) {
  KvBudget b;
  const std::string shown(text);
  if (text.empty()) return b;
  if (text.back() == '%') {
    b.percent = true;
    text.remove_suffix(1);
  }
  int64_t v = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  // A percentage may have one decimal (12.5%).
  if (b.percent && ec == std::errc() && end + 2 == text.data() + text.size() && *end == '.' &&
      end[1] >= '0' && end[1] <= '9') {
    b.tenths = end[1] - '0';
    end += 2;
  }
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    return Status::Error(
        StrFormat("%.*s '%s': expected a number of positions (e.g. 1024) or a "
                  "percentage of the sequence's length (e.g. 25%%)",
                  static_cast<int>(what.size()), what.data(), shown.c_str()));
  }
  if (v < 0 || (b.percent && (v > 100 || (v == 100 && b.tenths > 0))) || v > INT32_MAX) {
    return Status::Error(StrFormat("%.*s '%s': must be %s", static_cast<int>(what.size()),
                                   what.data(), shown.c_str(),
                                   b.percent ? "between 0% and 100%" : "0 (off) or positive"));
  }
  b.value = static_cast<int32_t>(v);
  if (b.value == 0 && b.tenths == 0) return KvBudget{};
  if (!b.percent && b.value < int64_t{guard.sink} + guard.window) {
    return Status::Error(StrFormat(
        "%.*s %d: must be at least --kv-sink + --kv-window (%d + %d), which are never evicted",
        static_cast<int>(what.size()), what.data(), b.value, guard.sink, guard.window));
  }
  return b;
}

Status EvictionConfig::Validate() const {
  if (guard.sink < 0 || guard.sink > 1 << 20) {
    return Status::Error(StrFormat("--kv-sink %d: must be between 0 and 1048576", guard.sink));
  }
  if (guard.window < 0 || guard.window > 1 << 20) {
    return Status::Error(StrFormat("--kv-window %d: must be between 0 and 1048576", guard.window));
  }
  if (every < 0) return Status::Error(StrFormat("--evict-every %d: must be >= 0", every));
  // tri is made by EngineBuilder (it needs a calibration pass); the others by name.
  if (policy != "tri") {
    auto made = MakeEvictionPolicy(policy);
    if (!made.ok()) return made.status();
  }
  if (budget.active() && !budget.percent && budget.value < int64_t{guard.sink} + guard.window) {
    return Status::Error(StrFormat(
        "--kv-budget %d: must be at least --kv-sink + --kv-window (%d + %d), which are never "
        "evicted",
        budget.value, guard.sink, guard.window));
  }
  return Status::Ok();
}

}  // namespace kvs
