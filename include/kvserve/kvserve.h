// kvserve's embedding API: load a GGUF model, start an engine (paged KV cache, continuous
// batching), submit requests with their sampling parameters, stream their tokens, cancel them.
// The kvserve CLI and server use exactly this; see examples/embed.cc.
//
// Thread safety: Model is immutable after Load and may be shared by engines. Engine::Submit and
// Engine::Cancel may be called from any thread. Token callbacks run on the engine's front-end
// thread, never on the loop that runs the model: in order for each request, one at a time, and
// they may call Cancel (a slow callback delays other requests' callbacks, not their steps).
// By the time ~Engine returns, every callback has run.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kvserve {

struct ModelOptions {
  // Read every weight once at load and refuse the model, naming the tensor and the element,
  // if one is NaN or infinite (llama.cpp's --check-tensors). Off by default: it costs a pass
  // over the whole file.
  bool check_tensors = false;
};

class Model {
 public:
  // Loads weights (repacked for the kernels) and the tokenizer. nullptr with *error on failure.
  static std::shared_ptr<Model> Load(const std::string& path, std::string* error);
  static std::shared_ptr<Model> Load(const std::string& path, const ModelOptions& options,
                                     std::string* error);
  ~Model();

  // Text to token ids; add_special adds BOS/EOS as the model's metadata asks.
  std::vector<int32_t> Tokenize(std::string_view text, bool add_special = true) const;
  std::string Detokenize(const std::vector<int32_t>& tokens) const;
  // One token's text on its own (control tokens as written, e.g. "</s>").
  std::string TokenText(int32_t token) const;
  // The GGUF's tokenizer.chat_template ("" when absent).
  std::string ChatTemplate() const;
  int32_t eos_token() const;
  bool IsEndOfGeneration(int32_t token) const;
  int32_t bos_token() const;
  int32_t n_vocab() const;
  int32_t n_ctx_train() const;
  const std::string& name() const;
  // 32 hex digits: a digest of the whole GGUF file as loaded (any changed byte changes it).
  std::string weights_digest() const;
  // KV bytes per position (all layers, K and V, scales included) with the given cache types;
  // -1 if a type is unknown or cannot hold this model's head size.
  double kv_bytes_per_token(const std::string& cache_type_k = "f16",
                            const std::string& cache_type_v = "f16") const;
  // KV bytes one sequence of `positions` positions holds at its peak in an engine's pool of
  // block_size-position blocks, prefilled in chunks of at most max_batch_tokens: a model with
  // sliding-window layers keeps a block table per group of layers, and a window's holds the
  // window (and a chunk), not every position, in its own layers only. Size a pool with it, not
  // with positions x kv_bytes_per_token. -1 as kv_bytes_per_token.
  int64_t kv_bytes_per_sequence(int64_t positions, int32_t block_size, int32_t max_batch_tokens,
                                const std::string& cache_type_k = "f16",
                                const std::string& cache_type_v = "f16") const;
  // The same in blocks (each holds one group's layers: a model of one group, every layer).
  int64_t kv_blocks_per_sequence(int64_t positions, int32_t block_size,
                                 int32_t max_batch_tokens) const;

  struct Impl;
  const Impl& impl() const { return *impl_; }

 private:
  explicit Model(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The default step-time target of stall-free batching (--max-step-ms); see docs/BENCHMARKS.md.
inline constexpr double kDefaultMaxStepMs = 100;

struct EngineOptions {
  int32_t n_ctx = 4096;            // -c: most tokens (prompt + output) of one sequence
  int32_t n_parallel = 4;          // -np: sequences decoded together (at most 1024)
  int32_t max_batch_tokens = 512;  // tokens computed per step (prefill chunks + decodes)
  // Stall-free batching: while sequences decode, a step's prefill share is cut so that the step
  // takes about this long (a cost model fitted to the steps run); 0: steps of max_batch_tokens.
  double max_step_ms = kDefaultMaxStepMs;
  int32_t block_size = 16;  // positions per KV block (a multiple of 16)
  // KV cache memory; 0: room for n_parallel full contexts, at most half the available RAM.
  int64_t kv_memory_bytes = 0;
  // 0: one per CPU this process may use; more than that are clamped to it, with a warning.
  int32_t threads = 0;
  // Baseline for `kvserve bench memory`: reserve n_ctx positions per sequence on admission,
  // as a contiguous cache does, instead of growing block by block.
  bool reserve_full_context = false;
  // Prefix caching: full KV blocks of repeated prefixes are computed once and shared.
  bool prefix_cache = true;
  // KV cache element types (--cache-type-k / --cache-type-v): f32, f16, bf16, q8_0, q4_0, int8,
  // fp8, turbo4, turbo3.
  std::string cache_type_k = "f16";
  std::string cache_type_v = "f16";
  // --kv-calibration: text whose keys decide how a quantized K type codes keys (empty: a
  // built-in paragraph). Part of the KV format fingerprint.
  std::string kv_calibration_file;
  // --kv-calibration-tokens: how many of its tokens are read (key codings use the first 512; a
  // tier's transform codec fits its basis on all of them).
  int32_t kv_calibration_tokens = 512;

  // Speculative decoding (--spec-type): "none", "draft" (a second GGUF with the same
  // vocabulary, draft_model), "ngram" (prompt lookup), "self" (the model's own weights
  // re-quantized to draft_weights, attending to a window of its own KV). The output is the
  // model's own: greedy output is unchanged token for token, sampled output keeps its
  // distribution (rejection sampling).
  std::string spec_type = "none";
  std::shared_ptr<const Model> draft_model;  // -md/--model-draft, for "draft"
  std::string draft_weights;                 // --draft-weights q8_0|q4_0|f16 ("": by target type)
  int32_t draft_window = 0;  // --draft-window: recent positions a self draft reads (0: all)
  int32_t draft_max = 4;     // --draft-max: most drafts per sequence and step
  int32_t draft_min = 0;     // --draft-min: adaptive k never goes below it

  // Token eviction: each sequence keeps at most kv_budget positions ("1024", or "25%" of its
  // length; "" or "0": off), never the first kv_sink nor the last kv_window; evict_policy
  // scores the rest (streaming, h2o, snapkv, keydiff, tri); evicted blocks return to the pool.
  std::string kv_budget;
  int32_t kv_sink = 4;
  int32_t kv_window = 32;
  std::string evict_policy = "streaming";
  int32_t evict_every = 0;  // decode steps between evictions (0: once a block past the budget)

  // Disk tier under the prefix cache (--kv-disk DIR): computed blocks are kept in DIR, keyed by
  // their chain hash, and loaded instead of recomputed (across restarts too). "": off.
  std::string kv_disk;
  int64_t kv_disk_size = 0;                      // bytes; 0: 20G or the free space, if less
  std::string kv_disk_policy = "write-through";  // or "write-back"
  std::string kv_disk_codec = "raw";             // "zstd", or "tc:BITS[,sink=N]" (transform-coded)

  // Shared tier in Redis (--kv-redis redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]): blocks are
  // written behind as they are computed and looked up, after RAM and disk, on a prefix miss, so
  // replicas reuse each other's prompts. "": off.
  std::string kv_redis;
  std::string kv_redis_password_file;  // its first line is the password (overrides the URL's)
  int64_t kv_redis_ttl = 0;            // seconds; 0: keys do not expire (maxmemory evicts)
  int64_t kv_redis_timeout_ms = 500;   // connect and every command
  std::string kv_redis_namespace = "kvserve";  // key prefix
  std::string kv_redis_codec = "zstd";         // or "tc:BITS[,sink=N]"

  // KV events for KV-aware routers (--kv-events ENDPOINT): every block the RAM prefix cache
  // stores or removes, published as vLLM's msgpack batches on a ZeroMQ PUB socket. "": off.
  std::string kv_events;
  std::string kv_events_replay;  // a ROUTER socket replaying recent batches by sequence number
  std::string kv_events_topic;   // the first frame of every message (llm-d: kv@POD@MODEL)
};

struct GenerationOptions {
  int32_t max_tokens = 128;  // per choice; -1: until end of generation or the context is full
  int32_t n = 1;             // choices sharing one prefill
  int32_t priority = 0;      // higher first
  float temperature = 0.8f;  // 0: greedy
  int32_t top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;
  int32_t repeat_last_n = 64;
  float frequency_penalty = 0.f;
  float presence_penalty = 0.f;
  uint64_t seed = 0xC0FFEE;
  int32_t logprobs = -1;    // >= 0: each event carries the token's log-probability and this
                            // many most likely alternatives (at most 20)
  std::string cache_salt;   // requests with different salts never share cached KV
  bool ignore_eos = false;  // else the model's end-of-generation tokens stop a choice
  std::vector<int32_t> stop_tokens;  // more tokens that stop a choice
  bool speculative = true;  // false: never draft for this request (when the engine speculates)
  std::string kv_budget;    // this request's KV budget ("512", "25%"); "": the engine's
};

struct TokenEvent {
  uint64_t request = 0;
  int32_t choice = 0;
  int32_t token = -1;  // -1: an end without a token (cancelled, error)
  std::string text;    // the text this token completes (UTF-8 safe; rest flushed at the end)
  bool finished = false;
  std::string finish_reason;  // "stop", "length", "cancelled", "error"
  std::string error;
  float logprob = 0;  // with GenerationOptions::logprobs >= 0
  struct Alternative {
    int32_t token;
    std::string text;
    float logprob;
  };
  std::vector<Alternative> top_logprobs;
  int32_t cached_tokens = 0;  // prompt tokens of this request served from the prefix cache
  // Of those, the ones a tier under the cache loaded for it: one entry per tier that loaded
  // any, in the order the tiers are asked (TierNames()).
  struct TierTokens {
    std::string tier;  // "disk", "redis"
    int32_t tokens = 0;
  };
  std::vector<TierTokens> tier_tokens;
  int32_t TokensFrom(std::string_view tier) const;  // 0 when that tier loaded none
};
using TokenCallback = std::function<void(const TokenEvent&)>;

// The names of the tiers this build can put under the prefix cache ("disk", "redis"), in the
// order an engine asks them: a tier's label in metrics, stats and usage (`<name>_tokens`).
std::vector<std::string> TierNames();

// One tier's totals, in blocks and bytes (GET /metrics labels them tier="<name>").
struct TierStats {
  std::string name;     // "disk" (--kv-disk), "redis" (--kv-redis)
  bool up = false;      // it writes, and (a remote store) answered the last attempt to reach it
  int64_t hits = 0;     // blocks loaded from it
  int64_t misses = 0;   // blocks past the RAM prefix cache (and the tiers before it) it lacked
  int64_t corrupt = 0;  // stored blocks that failed a check (never loaded; removed)
  int64_t bytes_read = 0;
  double read_seconds = 0;  // the loader's busy time: bytes_read / it is its read rate
  int64_t bytes_written = 0;
  int64_t payload_bytes_written = 0;  // the KV bytes in them (the codec's ratio)
  int64_t blocks_written = 0;
  int64_t dropped = 0;  // blocks not written (write queue full, the write failed, or it is off)
  int64_t errors = 0;   // failed commands or connections (a local store: refused writes)
  // -1 where the tier does not know (a shared remote store).
  int64_t usage_bytes = -1;
  int64_t capacity_bytes = -1;
  int64_t blocks = -1;
};

struct EngineStats {
  int32_t running = 0;
  int32_t waiting = 0;
  int32_t kv_blocks_free = 0;
  int32_t kv_blocks_total = 0;
  int32_t block_size = 0;
  int64_t steps = 0;
  int64_t tokens_computed = 0;
  int64_t preemptions = 0;
  int64_t prefix_cache_queries = 0;  // prompt tokens looked up
  int64_t prefix_cache_hits = 0;     // prompt tokens found cached
  // Speculative decoding totals (vLLM's spec_decode counters).
  int64_t spec_drafts = 0;           // verifications with at least one draft
  int64_t spec_draft_tokens = 0;     // tokens drafted
  int64_t spec_accepted_tokens = 0;  // of those, accepted
  // Token eviction totals.
  int64_t evicted_tokens = 0;              // positions dropped
  int64_t compactions = 0;                 // evictions that dropped any
  int64_t blocks_freed_by_compaction = 0;  // whole blocks they returned to the pool
  // The tiers under the prefix cache, in the order they are asked (a configured tier that is
  // off from the start is listed, down). tier(name): the one labelled name, or null.
  std::vector<TierStats> tiers;
  const TierStats* tier(std::string_view name) const;
};

// What GET /v1/kv/lookup answers: the prompt's full blocks, and how many leading ones are held.
struct KvPrefixLookup {
  int32_t prompt_tokens = 0;
  int32_t block_size = 0;
  int32_t ram_tokens = 0;   // leading tokens whose blocks are in the RAM prefix cache
  int32_t disk_tokens = 0;  // the tokens after those whose blocks are on the disk tier
  // [full blocks] their chain hashes, 32 hex digits each (the hashes KV events publish)
  std::vector<std::string> block_hashes;
};

// The KV cache now (GET /v1/kv/state, the dashboard's block map), taken between two steps.
struct KvSequenceState {
  uint64_t request = 0;
  int32_t choice = 0;  // which of the request's n choices
  int32_t prompt_tokens = 0;
  int32_t output_tokens = 0;
  int32_t cached_tokens = 0;    // of the prompt, found in the prefix cache (RAM and tiers)
  std::vector<int32_t> blocks;  // its block table: pool block ids, in position order
};
struct KvCacheState {
  int32_t block_size = 0;
  int32_t num_blocks = 0;  // usable blocks (ids 1..num_blocks)
  // One letter per block, id 1 first: 'f' free, 'c' free but cached (a prefix-cache entry kept
  // until the pool reuses it), 'u' in use by one sequence, 's' shared by several.
  std::string blocks;
  std::vector<std::pair<int32_t, int32_t>> shared;  // (block id, refcount) of the 's' blocks
  std::vector<KvSequenceState> running;
  int32_t waiting = 0;
};

// A named prompt prefix kept on the disk tier (POST /v1/kv/documents, `kvserve kv save`).
struct KvDocumentInfo {
  std::string name;
  std::string status;  // "ready", or "saving" while it is prefilled and written
  int32_t tokens = 0;
  int32_t blocks = 0;          // full blocks (the tail of fewer tokens is not kept)
  int32_t blocks_on_disk = 0;  // of those, in the store now
  int64_t created = 0;         // unix seconds
  std::string model;           // weights digest
};

class Engine {
 public:
  // Reserves the KV memory and starts the engine thread. nullptr with *error on bad options.
  static std::unique_ptr<Engine> Start(std::shared_ptr<const Model> model,
                                       const EngineOptions& options, std::string* error);
  ~Engine();  // cancels what is left and stops

  // Queues a request; returns its id, or 0 with *error (bad prompt or options).
  uint64_t Submit(std::vector<int32_t> prompt, const GenerationOptions& options,
                  TokenCallback on_token, std::string* error);
  void Cancel(uint64_t request);
  void CancelAll();
  EngineStats stats() const;
  const EngineOptions& options() const;  // with the resolved KV memory
  // The KV format in one line (types, key coding, calibration, fingerprint), and its
  // fingerprint alone (32 hex digits).
  std::string kv_format() const;
  std::string kv_format_fingerprint() const;

  // Drops the prefix cache's unused blocks from RAM (vLLM's /reset_prefix_cache; under
  // write-back they are written to the disk tier first). Returns how many were dropped.
  int32_t ResetPrefixCache();
  // How many leading tokens of a prompt (salted like a request) this replica holds now: whole
  // blocks, in RAM and, continuing the chain, on its disk tier (GET /v1/kv/lookup). Redis is
  // not asked (a router reads the shared tier's keys itself). False with *error when shutting
  // down.
  bool LookupKvPrefix(const std::vector<int32_t>& tokens, const std::string& cache_salt,
                      KvPrefixLookup* out, std::string* error) const;
  // A snapshot of every block's state and the running sequences' block tables, read on the
  // engine's thread between steps (costs nothing when nobody asks). False with *error when
  // shutting down.
  bool KvState(KvCacheState* out, std::string* error) const;
  // KV documents (need --kv-disk). Save prefills tokens (salted like a request), waits until
  // its full blocks are on disk and pins them; progress(blocks on disk, blocks) is called as
  // they arrive. False with *error on a bad name, a name being saved, a tier that failed.
  bool SaveKvDocument(const std::string& name, std::vector<int32_t> tokens,
                      const std::string& cache_salt, KvDocumentInfo* out, std::string* error,
                      const std::function<void(int32_t, int32_t)>& progress = nullptr);
  std::vector<KvDocumentInfo> ListKvDocuments() const;
  bool GetKvDocument(const std::string& name, KvDocumentInfo* out, std::string* error) const;
  bool RemoveKvDocument(const std::string& name, std::string* error);

  struct Impl;

 private:
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The instruction-set level kvserve's kernels run at in this process: "avx512", "avx2" or
// "scalar" on x86-64, "neon" or "scalar" on ARM64 (the CPU's best, or KVSERVE_ISA's choice).
std::string CpuIsa();
// The same with the CPU's name and the features the level uses, for logs.
std::string CpuIsaDescription();

// A KV budget as a request or --kv-budget gives it ("512" positions, or "25%" of the sequence's
// length): its form and range checked, and that it is at least kv_sink + kv_window (the
// positions eviction never takes; 0 and 0 check the form alone). True with *canonical set to
// its canonical text ("" when it means no budget of its own), or false with *error set.
bool CheckKvBudget(const std::string& text, int32_t kv_sink, int32_t kv_window,
                   std::string* canonical, std::string* error);

}  // namespace kvserve
