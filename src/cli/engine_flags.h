// Engine flags shared by the commands that run the engine (generate, bench, serve), named as a
// llama.cpp / vLLM user expects: -c, -np, --kv-memory, --block-size, --max-batch-tokens,
// --cache-type-k/-v (-ctk/-ctv), -t.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "kvserve/kvserve.h"

namespace kvs::cli {

struct EngineFlags {
  kvserve::EngineOptions options;
  std::string kv_memory;     // BYTES (K/M/G suffixes, KiB/MiB/GiB too) or N% of available RAM
  std::string kv_disk_size;  // --kv-disk-size BYTES
  CLI::Option* kv_disk_policy_flag = nullptr;  // given without --kv-disk: an error
  CLI::Option* kv_disk_codec_flag = nullptr;
  CLI::Option* kv_redis_codec_flag = nullptr;         // given without --kv-redis: an error
  CLI::Option* kv_calibration_tokens_flag = nullptr;  // without --kv-calibration: an error
  std::string draft_model_path;                       // -md/--model-draft
  // The speculation flags that only some --spec-type use: given with another, they are an
  // error rather than silently ignored (AddSpecFlags sets them, ResolveSpecFlags reads them).
  CLI::Option* draft_max_flag = nullptr;
  CLI::Option* draft_min_flag = nullptr;
  CLI::Option* draft_weights_flag = nullptr;
  CLI::Option* draft_window_flag = nullptr;
  CLI::Option* ctx_flag = nullptr;  // -c, to tell a default from a given context
};

// Registers the flags on cmd; default_parallel is -np's default for this command.
void AddEngineFlags(CLI::App* cmd, EngineFlags* flags, int32_t default_parallel);

// --kv-budget, --kv-sink, --kv-window, --evict-policy, --evict-every (token eviction).
void AddEvictionFlags(CLI::App* cmd, EngineFlags* flags);

// --kv-disk, --kv-disk-size, --kv-disk-policy, --kv-disk-codec (the disk tier).
void AddKvDiskFlags(CLI::App* cmd, EngineFlags* flags);

// --kv-redis, --kv-redis-password-file, --kv-redis-ttl, --kv-redis-timeout-ms,
// --kv-redis-namespace (the shared tier).
void AddKvRedisFlags(CLI::App* cmd, EngineFlags* flags);

// --kv-events, --kv-events-replay, --kv-events-topic (KV events for routers).
void AddKvEventFlags(CLI::App* cmd, EngineFlags* flags);

// --check-tensors, for every command that loads a model to run it.
void AddModelFlags(CLI::App* cmd, kvserve::ModelOptions* options);

// A CLI11 check for a real-valued flag: NaN and values outside [lo, hi] ((lo, hi] when lo_open)
// are errors. CLI11's Range lets NaN through and prints its bounds with six decimals.
CLI::Validator RealRange(double lo, double hi, bool lo_open = false);

// Turns --kv-memory (and --kv-disk-size) into bytes (0 when unset); false, with the error on
// stderr, when one does not parse.
bool ResolveKvMemory(EngineFlags* flags);

// Loads -md (when given) into options.draft_model and refuses the speculation flags given without
// the --spec-type that uses them (what only the command line knows: whether a flag was given);
// false, with the error on stderr, otherwise. The options themselves are checked where every
// engine's are, by kvserve::Engine::Start (ResolveEngineOptions, api/engine_setup.h).
bool ResolveSpecFlags(EngineFlags* flags);

// "512M", "2GiB", "1e9", "2T", "25%" (of the available RAM) -> bytes; false, with an error naming
// flag, when malformed or above 1e15 bytes.
bool ParseMemorySize(const std::string& text, int64_t* bytes, std::string* error,
                     const char* flag = "--kv-memory");

}  // namespace kvs::cli
