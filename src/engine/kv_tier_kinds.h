// The kinds of tier an engine may have under its RAM prefix cache (disk, Redis), in the order
// it asks them. Adding a tier: its BlockStore (src/kv), one entry in TierKinds()
// (engine/kv_tier_kinds.cc) and its configuration; its name is then the `tier` label of its
// metrics, its key in stats and in a request's usage (`<name>_tokens`).
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "engine/engine.h"
#include "engine/kv_tier.h"

namespace kvs {

// What a tier's opener is given.
struct TierContext {
  const EngineConfig& config;
  BlockIdentity identity;  // what the pool's blocks depend on (block files carry it)
  KvStorage& storage;      // the pool a tier loads into and writes from
  // A transform codec for options over the pool's KV format (fitted once per engine; the fit
  // saved in dir when dir is not empty).
  std::function<Expected<std::shared_ptr<const KvBlockCodec>>(const TransformCodecOptions&,
                                                              const std::string& dir)>
      transform;
};

struct TierKind {
  std::string_view name;  // its store's name(): the tier's label
  const char* flag;       // the flag that turns it on, for messages
  bool (*configured)(const EngineConfig&);
  // The tier config asks for; null when it is off from the start (logged: serving goes on).
  Expected<std::unique_ptr<KvTier>> (*open)(const TierContext&);
};

std::span<const TierKind> TierKinds();
// Their names, in the same order (what usage and metrics list even when a tier is not on).
std::vector<std::string> TierNames();

}  // namespace kvs
