#include "cli/engine_flags.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "cli/bench_spec.h"
#include "cli/commands.h"
#include "core/memory_info.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "engine/kv_format_factory.h"
#include "engine/transform_codec.h"
#include "kernels/kv_types.h"
#include "kv/redis_block_store.h"

namespace kvs::cli {
namespace {

// 0.5, 100, 1e-06: the shortest form, for messages and --help.
std::string FormatReal(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

// CLI11's check of a block codec name: "" when valid, else why not.
std::string CheckBlockCodec(const std::string& name) {
  if (name.rfind("tc:", 0) == 0) {
    auto options = ParseTransformCodec(name);
    return options.ok() ? "" : options.error();
  }
  return name == "raw" || name == "zstd" ? "" : "expected raw, zstd or tc:BITS[,sink=N]";
}

}  // namespace

void AddEngineFlags(CLI::App* cmd, EngineFlags* f, int32_t default_parallel) {
  kvserve::EngineOptions& o = f->options;
  o.n_parallel = default_parallel;
  o.threads = ThreadPool::DefaultThreadCount();
  f->ctx_flag =
      cmd->add_option(
             "-c,--ctx-size", o.n_ctx,
             "Most tokens (prompt + output) of one sequence (0: the model's training context)")
          ->capture_default_str()
          ->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--parallel", o.n_parallel,
                  "Sequences decoded together (continuous batching); also -np")
      ->capture_default_str()
      ->check(CLI::Range(1, kMaxParallelSequences));
  cmd->add_option("--kv-memory", f->kv_memory,
                  "KV cache size: bytes (512M, 4G, 2GiB) or a share of the available RAM (25%); "
                  "default: -np full contexts, at most half the available RAM");
  cmd->add_option("--block-size", o.block_size, "Positions per KV block (a multiple of 16)")
      ->capture_default_str()
      ->check(CLI::Range(16, 1024));
  cmd->add_option("--max-batch-tokens", o.max_batch_tokens,
                  "Tokens computed per step: prompt chunks and decodes together")
      ->capture_default_str()
      ->check(CLI::Range(1, 65536));
  cmd->add_option("--max-step-ms", o.max_step_ms,
                  "Stall-free batching: while sequences decode, cut a step's prompt tokens so "
                  "that it takes about this long (a cost model fitted to the steps run) and "
                  "at most twice the decode step it joins; 0: off, every step computes up to "
                  "--max-batch-tokens")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 60000.0))
      ->check(CLI::Validator(
          [](std::string& s) -> std::string {
            return std::isfinite(std::strtod(s.c_str(), nullptr)) ? "" : "must be a number";
          },
          "", "finite"));
  cmd->add_option("--cache-type-k", o.cache_type_k,
                  "KV cache type of keys: " + KvTypeNames() + "; also -ctk")
      ->capture_default_str();
  cmd->add_option("--cache-type-v", o.cache_type_v,
                  "KV cache type of values (same choices); also -ctv")
      ->capture_default_str();
  cmd->add_option("--kv-calibration", o.kv_calibration_file, kKvCalibrationHelp);
  f->kv_calibration_tokens_flag =
      cmd->add_option("--kv-calibration-tokens", o.kv_calibration_tokens, kKvCalibrationTokensHelp)
          ->capture_default_str()
          ->check(CLI::Range(16, kvs::kMaxCalibrationTokensFlag));
  cmd->add_flag("!--no-prefix-cache", o.prefix_cache,
                "Do not share the KV of repeated prompt prefixes between requests");
  AddSpecFlags(cmd, f);
  AddEvictionFlags(cmd, f);
  AddKvDiskFlags(cmd, f);
  AddKvRedisFlags(cmd, f);
  AddKvEventFlags(cmd, f);
  cmd->add_option("-t,--threads", o.threads, kThreadsHelp)
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
}

void AddSpecFlags(CLI::App* cmd, EngineFlags* f) {
  kvserve::EngineOptions& o = f->options;
  cmd->add_option("--spec-type", o.spec_type,
                  "Speculative decoding: none, draft (a draft model, -md), ngram (prompt lookup), "
                  "self (the model's own re-quantized weights over its KV, or a window of it: "
                  "--draft-window); the "
                  "output stays the model's own")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "draft", "ngram", "self"}));
  cmd->add_option("--model-draft", f->draft_model_path,
                  "Draft model for --spec-type draft: a GGUF with the same vocabulary; also -md");
  f->draft_max_flag =
      cmd->add_option("--draft-max,--draft,--draft-n", o.draft_max,
                      "Most tokens drafted per sequence and step (adaptive below it)")
          ->capture_default_str()
          ->check(CLI::Range(1, 32));
  f->draft_min_flag =
      cmd->add_option("--draft-min", o.draft_min,
                      "Fewest tokens drafted per step: adaptive k never goes below it (>= 1: "
                      "speculation never switches itself off)")
          ->capture_default_str()
          ->check(CLI::Range(0, 32));
  f->draft_weights_flag = cmd->add_option(
      "--draft-weights", o.draft_weights,
      "--spec-type self: the type the model's matrices are re-quantized to for "
      "drafting: q8_0, q4_0, f16, optionally with ffn=TYPE (ffn_gate/ffn_up) and "
      "output=TYPE, e.g. q8_0,ffn=q4_0 (default: q8_0 for f32/f16/bf16 models, q4_0 "
      "for others where smaller)");
  f->draft_window_flag =
      cmd->add_option("--draft-window", o.draft_window,
                      "--spec-type self: recent positions the draft attends to, besides 16 sink "
                      "positions (0: the whole context; a window pays only where the model's "
                      "attention is local)")
          ->capture_default_str()
          ->check(CLI::Range(0, 1 << 24));
}

void AddEvictionFlags(CLI::App* cmd, EngineFlags* f) {
  kvserve::EngineOptions& o = f->options;
  cmd->add_option("--kv-budget", o.kv_budget,
                  "Token eviction: positions of KV each sequence keeps (e.g. 1024), or a share "
                  "of its length (25%); the rest is evicted and whole blocks return to the pool "
                  "(default: off)");
  cmd->add_option("--kv-sink", o.kv_sink, "Token eviction: first positions never evicted")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--kv-window", o.kv_window, "Token eviction: most recent positions never evicted")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_option("--evict-policy", o.evict_policy,
                  "Token eviction: which positions to keep: streaming (sinks + recent; the best "
                  "of the fidelity table, see README), keydiff (keys least like the mean key), "
                  "h2o (attention received), snapkv (attention of the prompt's last tokens, "
                  "pooled), tri (key geometry against calibrated query centres)")
      ->capture_default_str()
      ->check(CLI::IsMember({"keydiff", "streaming", "h2o", "snapkv", "tri"}));
  cmd->add_option("--evict-every", o.evict_every,
                  "Token eviction: decode steps between evictions (0: once a sequence has grown "
                  "a block past its budget)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1 << 20));
}

void AddKvDiskFlags(CLI::App* cmd, EngineFlags* f) {
  kvserve::EngineOptions& o = f->options;
  cmd->add_option("--kv-disk", o.kv_disk,
                  "Disk tier: keep computed KV blocks in DIR (checksummed files keyed by their "
                  "prefix hash) and load them instead of recomputing, across restarts too")
      ->check([](const std::string& dir) -> std::string {
        if (dir.empty()) return "--kv-disk needs a directory";
        if (dir == "/") return "--kv-disk /: give a directory of its own";
        return "";
      });
  cmd->add_option("--kv-disk-size", f->kv_disk_size,
                  "Disk tier: most bytes it keeps, least recently used dropped first (20G, 1T, "
                  "512M; default: 20G or the free space, whichever is less)");
  f->kv_disk_policy_flag =
      cmd->add_option("--kv-disk-policy", o.kv_disk_policy,
                      "Disk tier: write-through (write blocks as they are computed: a crash keeps "
                      "them) or write-back (write when they leave RAM, and at shutdown)")
          ->capture_default_str()
          ->check(CLI::IsMember({"write-through", "write-back"}));
  f->kv_disk_codec_flag =
      cmd->add_option("--kv-disk-codec", o.kv_disk_codec,
                      "Disk tier: how block bytes are stored: raw, zstd (smaller files, slower "
                      "writes and loads), or tc:BITS[,sink=N] (transform-coded: each head's PCA "
                      "from the calibration text, BITS per element spread over its components; "
                      "lossy, about 16/BITS times smaller than f16; sink=N keeps the first N "
                      "positions as f16)")
          ->capture_default_str()
          ->check(CheckBlockCodec);
}

void AddKvRedisFlags(CLI::App* cmd, EngineFlags* f) {
  kvserve::EngineOptions& o = f->options;
  cmd->add_option("--kv-redis", o.kv_redis,
                  "Shared tier: a Redis server that replicas share, "
                  "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]. Computed KV blocks are written "
                  "behind and looked up after RAM and disk on a prefix miss; Redis down or slow "
                  "costs reuse, never a request")
      ->check([](const std::string& url) -> std::string {
        auto endpoint = ParseRedisUrl(url);
        if (endpoint.ok()) return "";
        // CLI11 puts "--kv-redis: " before the message; the parser's own starts the same way.
        const std::string& why = endpoint.error();
        const std::string_view flag = "--kv-redis ";
        return why.rfind(flag, 0) == 0 ? why.substr(flag.size()) : why;
      });
  f->kv_redis_codec_flag =
      cmd->add_option("--kv-redis-codec", o.kv_redis_codec,
                      "Shared tier: how blocks are stored in Redis: zstd, or tc:BITS[,sink=N] "
                      "(transform-coded, as --kv-disk-codec)")
          ->capture_default_str()
          ->check([](const std::string& s) -> std::string {
            if (s.rfind("tc:", 0) == 0) return CheckBlockCodec(s);
            return s == "zstd" ? "" : "expected zstd or tc:BITS[,sink=N]";
          });
  cmd->add_option("--kv-redis-password-file", o.kv_redis_password_file,
                  "Shared tier: read Redis's password from the first line of FILE (kept out of "
                  "the command line; overrides a password in the URL)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--kv-redis-ttl", o.kv_redis_ttl,
                  "Shared tier: seconds a block lives in Redis (0: no expiry; Redis's maxmemory "
                  "policy, allkeys-lru, drops the least recently used)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{10} * 365 * 86400));
  cmd->add_option("--kv-redis-timeout-ms", o.kv_redis_timeout_ms,
                  "Shared tier: timeout of a connection and of every Redis command; past it the "
                  "lookup misses (computed instead) and Redis is retried with backoff")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{600000}));
  cmd->add_option("--kv-redis-namespace", o.kv_redis_namespace,
                  "Shared tier: prefix of the keys (blocks of other models never collide: keys "
                  "carry the weights' digest through the block hash)")
      ->capture_default_str();
}

void AddKvEventFlags(CLI::App* cmd, EngineFlags* f) {
  kvserve::EngineOptions& o = f->options;
  cmd->add_option("--kv-events", o.kv_events,
                  "KV events for KV-aware routers (llm-d, Dynamo): publish every block the prefix "
                  "cache stores or removes as vLLM's msgpack batches on a ZeroMQ PUB socket at "
                  "ENDPOINT (tcp://*:5557, tcp://127.0.0.1:5557: bound; an address not of this "
                  "host: connected to)");
  cmd->add_option("--kv-events-replay", o.kv_events_replay,
                  "KV events: a ROUTER socket at ENDPOINT that replays recent batches from a "
                  "sequence number (vLLM's replay_endpoint, e.g. tcp://*:5558)");
  cmd->add_option("--kv-events-topic", o.kv_events_topic,
                  "KV events: the topic frame of every message (llm-d reads kv@POD@MODEL)");
}

CLI::Validator RealRange(double lo, double hi, bool lo_open) {
  const std::string range = (lo_open ? "(" : "[") + FormatReal(lo) + ", " + FormatReal(hi) + "]";
  return CLI::Validator(
      [=](std::string& input) -> std::string {
        double v = 0;
        const bool parsed = CLI::detail::lexical_cast(input, v);
        // NaN compares false with everything, so test for being inside, not outside.
        if (parsed && (lo_open ? v > lo : v >= lo) && v <= hi) return "";
        return input + " is not in " + range;
      },
      "in " + range);
}

void AddModelFlags(CLI::App* cmd, kvserve::ModelOptions* options) {
  cmd->add_flag("--check-tensors", options->check_tensors,
                "Check every weight for NaN and infinity while loading (one more pass over the "
                "file); refuse the model if one is found");
}

bool ParseMemorySize(const std::string& text, int64_t* bytes, std::string* error,
                     const char* flag) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (...) {
    used = 0;
  }
  std::string unit = text.substr(used);
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  double scale = 0;
  if (unit.empty() || unit == "B") {
    scale = 1;
  } else if (unit == "K" || unit == "KB" || unit == "KIB") {
    scale = 1024.0;
  } else if (unit == "M" || unit == "MB" || unit == "MIB") {
    scale = 1024.0 * 1024;
  } else if (unit == "G" || unit == "GB" || unit == "GIB") {
    scale = 1024.0 * 1024 * 1024;
  } else if (unit == "T" || unit == "TB" || unit == "TIB") {
    scale = 1024.0 * 1024 * 1024 * 1024;
  } else if (unit == "%") {
    if (value > 100) used = 0;
    scale = AvailableRamBytes() / 100.0;
  }
  if (used == 0 || scale == 0 || !std::isfinite(value) || value <= 0) {
    *error = std::string(flag) + " '" + text +
             "': expected a positive size such as 512M, 4G, 2GiB, 1T or 25% (of the available RAM)";
    return false;
  }
  if (value * scale > 1e15) {
    *error = std::string(flag) + " '" + text + "': too large (it overflows; at most 1e15 bytes)";
    return false;
  }
  *bytes = static_cast<int64_t>(value * scale);
  if (*bytes < 1) {  // under a byte: 0 would read as "the default" downstream
    *error = std::string(flag) + " '" + text + "': less than one byte";
    return false;
  }
  return true;
}

bool ResolveSpecFlags(EngineFlags* f) {
  kvserve::EngineOptions& o = f->options;
  // -md alone means a draft model, as llama.cpp
  if (!f->draft_model_path.empty() && o.spec_type == "none") o.spec_type = "draft";
  const auto given = [](const CLI::Option* flag) { return flag && flag->count() > 0; };
  for (const CLI::Option* flag : {f->draft_max_flag, f->draft_min_flag}) {
    if (given(flag) && o.spec_type == "none") {
      std::fprintf(stderr,
                   "error: %s is only used with speculative decoding: --spec-type draft (-md), "
                   "ngram or self\n",
                   flag->get_name().c_str());
      return false;
    }
  }
  for (const CLI::Option* flag : {f->draft_weights_flag, f->draft_window_flag}) {
    if (given(flag) && o.spec_type != "self") {
      std::fprintf(stderr, "error: %s is only used with --spec-type self (here: %s)\n",
                   flag->get_name().c_str(), o.spec_type.c_str());
      return false;
    }
  }
  // The rest (--draft-min against --draft-max, a draft type without -md, -md with another type)
  // is ResolveEngineOptions' (api/engine_setup.h), as for every user of the API.
  if (f->draft_model_path.empty()) return true;
  std::string error;
  o.draft_model = kvserve::Model::Load(f->draft_model_path, &error);
  if (!o.draft_model) {
    std::fprintf(stderr, "error: draft model: %s\n", error.c_str());
    return false;
  }
  return true;
}

bool ResolveKvMemory(EngineFlags* f) {
  std::string error;
  if (!f->kv_disk_size.empty()) {
    if (f->kv_disk_size.find('%') != std::string::npos) {
      std::fprintf(
          stderr,
          "error: --kv-disk-size '%s': expected a positive size such as 20G, 512M or 1T (not a "
          "share of RAM)\n",
          f->kv_disk_size.c_str());
      return false;
    }
    if (!ParseMemorySize(f->kv_disk_size, &f->options.kv_disk_size, &error, "--kv-disk-size")) {
      std::fprintf(stderr, "error: %s\n", error.c_str());
      return false;
    }
  }
  if (f->options.kv_disk.empty()) {
    for (const CLI::Option* o : {f->kv_disk_policy_flag, f->kv_disk_codec_flag}) {
      if (o && o->count() > 0) {
        std::fprintf(stderr, "error: %s is only used with --kv-disk DIR\n", o->get_name().c_str());
        return false;
      }
    }
    if (!f->kv_disk_size.empty()) {
      std::fprintf(stderr, "error: --kv-disk-size is only used with --kv-disk DIR\n");
      return false;
    }
  }
  if (f->options.kv_calibration_file.empty() && f->kv_calibration_tokens_flag &&
      f->kv_calibration_tokens_flag->count() > 0) {
    std::fprintf(stderr,
                 "error: --kv-calibration-tokens is only used with --kv-calibration FILE (the "
                 "built-in paragraph is 64 tokens)\n");
    return false;
  }
  if (f->options.kv_redis.empty() && f->kv_redis_codec_flag &&
      f->kv_redis_codec_flag->count() > 0) {
    std::fprintf(stderr, "error: --kv-redis-codec is only used with --kv-redis URL\n");
    return false;
  }
  if (f->kv_memory.empty()) return true;
  if (ParseMemorySize(f->kv_memory, &f->options.kv_memory_bytes, &error)) return true;
  std::fprintf(stderr, "error: %s\n", error.c_str());
  return false;
}

}  // namespace kvs::cli
