// Configuration once (issue #41 item 5): kvserve::EngineOptions is the one options type, and
// ResolveEngineOptions is the one place that checks it and turns it into what the engine builder
// takes. kvserve::Engine::Start, `generate`'s one-request engine and the benches all build their
// engines from its result; the user-facing messages about options come from here (the engine's
// EngineConfig::Validate stays as an invariant check of what this made).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/status.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "engine/engine_builder.h"
#include "engine/kv_format_factory.h"
#include "engine/spec/spec_runtime.h"
#include "kv/zmq_event_publisher.h"
#include "kvserve/kvserve.h"
#include "model/weights.h"
#include "tokenizer/tokenizer.h"

namespace kvs {

// A pool of exactly n_blocks blocks (the null block included) and watermark_blocks, for an engine
// sized to its workload (`generate`'s one request, the benches' fixed KV memory) rather than from
// EngineOptions::kv_memory_bytes. n_blocks 0: from kv_memory_bytes; watermark -1: 1% of the pool.
struct PoolShape {
  int32_t n_blocks = 0;
  int32_t watermark_blocks = -1;
};

// What EngineOptions resolve to: everything an engine is built from.
struct EngineSetup {
  // The options as given, with the defaults resolved: kv_memory_bytes (the pool's bytes) and
  // threads (the pool's threads: one per CPU this process may use at most).
  kvserve::EngineOptions options;
  KvGeometry geometry;  // the cache types at the block size
  // The engine's config; its kv_event_sink is null (the caller opens `events` and sets it).
  EngineConfig config;
  SpecOptions spec;    // the drafter, for EngineBuilder::Speculative
  KvFormatOptions kv;  // the KV format's options, for the EngineBuilder
  std::optional<ZmqKvEventPublisherConfig> events;  // --kv-events, when given
};

// Checks options and derives the engine's config, drafter and KV format options from them for
// model: every refusal of bad options, or of options that do not go together, names the flag.
// tokenizer: reads --kv-calibration's text (null: none may be given). pool: see PoolShape.
Expected<EngineSetup> ResolveEngineOptions(const kvserve::EngineOptions& options,
                                           const Model& model, const Tokenizer* tokenizer,
                                           const PoolShape& pool = {});

// A synchronous engine built from setup over model on pool (`generate`, the benches; the API
// builds its AsyncEngine from the same setup). tokenizer: for the KV format's calibration.
Expected<LocalEngine> BuildLocalEngine(EngineSetup setup, const Model& model,
                                       const Tokenizer* tokenizer, ThreadPool& pool);

// The cache types' geometry at block_size for a model of config c; the error names the flag.
Expected<KvGeometry> CacheGeometry(const ModelConfig& c, int32_t block_size, const std::string& k,
                                   const std::string& v);

// A request's kv_budget ("512", "25%"; "" or "0": the engine's) against the guard: the one parse
// of a request's budget (kvserve::CheckKvBudget, kvserve::Engine::Submit).
Expected<KvBudget> ParseRequestKvBudget(const std::string& text, const EvictionGuard& guard);

}  // namespace kvs
