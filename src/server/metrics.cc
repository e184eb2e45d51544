#include "server/metrics.h"

#include <cstdio>

namespace kvs::server {

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  size_t i = 0;
  while (i < bounds_.size() && value > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += value;
  ++count_;
}

void Histogram::Render(const std::string& name, const std::string& help, std::string* out) const {
  char line[256];
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    if (i < bounds_.size()) {
      std::snprintf(line, sizeof line, "%s_bucket{le=\"%g\"} %llu\n", name.c_str(), bounds_[i],
                    static_cast<unsigned long long>(cumulative));
    } else {
      std::snprintf(line, sizeof line, "%s_bucket{le=\"+Inf\"} %llu\n", name.c_str(),
                    static_cast<unsigned long long>(cumulative));
    }
    *out += line;
  }
  std::snprintf(line, sizeof line, "%s_sum %.9g\n%s_count %llu\n", name.c_str(), sum_, name.c_str(),
                static_cast<unsigned long long>(count_));
  *out += line;
}

double Histogram::Quantile(double q) const {
  if (count_ == 0) return 0;
  const double rank = q * static_cast<double>(count_);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    const uint64_t before = cumulative;
    cumulative += counts_[i];
    if (static_cast<double>(cumulative) >= rank) {
      const double lo = i == 0 ? 0.0 : bounds_[i - 1], hi = bounds_[i];
      const double in = counts_[i] == 0 ? 0.0 : (rank - static_cast<double>(before)) / counts_[i];
      return lo + (hi - lo) * in;
    }
  }
  return bounds_.empty() ? 0.0 : bounds_.back();
}

Metrics::Summary Metrics::Summarize() const {
  std::lock_guard<std::mutex> lock(mu_);
  Summary s;
  s.prompt_tokens = prompt_tokens_;
  s.generation_tokens = generation_tokens_;
  s.requests_ok = requests_ok_;
  s.requests_failed = requests_failed_;
  s.ttft_p50 = ttft_.Quantile(0.5);
  s.ttft_p90 = ttft_.Quantile(0.9);
  s.ttft_p99 = ttft_.Quantile(0.99);
  s.itl_p50 = tpot_.Quantile(0.5);
  s.itl_p90 = tpot_.Quantile(0.9);
  s.itl_p99 = tpot_.Quantile(0.99);
  return s;
}

Metrics::Metrics()
    : ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
             10.0, 20.0, 40.0, 80.0}),
      tpot_({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0}),
      e2e_({0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
            240.0}) {}

void Metrics::RecordRequest(int64_t prompt_tokens, int64_t generation_tokens, double e2e_s,
                            bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += prompt_tokens;
  generation_tokens_ += generation_tokens;
  (ok ? requests_ok_ : requests_failed_) += 1;
  e2e_.Observe(e2e_s);
}

void Metrics::RecordTimeToFirstToken(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.Observe(seconds);
}

void Metrics::RecordInterTokenGap(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  tpot_.Observe(seconds);
}

namespace {

// One metric's HELP, TYPE and value lines; type is "gauge" or "counter".
void Gauge(std::string* out, const char* name, const char* type, const char* help, double v) {
  char line[512];
  std::snprintf(line, sizeof line, "# HELP kvserve:%s %s\n# TYPE kvserve:%s %s\nkvserve:%s %.9g\n",
                name, help, name, type, name, v);
  *out += line;
}

// The prefix cache's lookups, speculative decoding's drafts and token eviction's drops.
void RenderCacheGauges(const kvserve::EngineStats& s, std::string* out) {
  Gauge(out, "prefix_cache_queries_total", "counter",
        "Prompt tokens looked up in the prefix cache.",
        static_cast<double>(s.prefix_cache_queries));
  Gauge(out, "prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.",
        static_cast<double>(s.prefix_cache_hits));
  // Speculative decoding, with vLLM's names (acceptance rate = accepted / draft tokens).
  Gauge(out, "spec_decode_num_drafts_total", "counter",
        "Speculative verifications (a sequence's drafts checked in one step).",
        static_cast<double>(s.spec_drafts));
  Gauge(out, "spec_decode_num_draft_tokens_total", "counter", "Tokens drafted.",
        static_cast<double>(s.spec_draft_tokens));
  Gauge(out, "spec_decode_num_accepted_tokens_total", "counter", "Drafted tokens accepted.",
        static_cast<double>(s.spec_accepted_tokens));
  // Token eviction (--kv-budget, or a request's kv_budget): what it dropped and what it gave
  // back to the pool. Blocks freed per compaction shows whether evicting buys memory at all.
  Gauge(out, "evicted_tokens_total", "counter", "KV positions dropped by token eviction.",
        static_cast<double>(s.evicted_tokens));
  Gauge(out, "compactions_total", "counter",
        "Token evictions that dropped positions (compactions).",
        static_cast<double>(s.compactions));
  Gauge(out, "blocks_freed_by_compaction_total", "counter",
        "KV blocks returned to the pool by compactions.",
        static_cast<double>(s.blocks_freed_by_compaction));
}

// One figure of a tier under the prefix cache; value < 0: the tier does not know it.
struct TierField {
  const char* suffix;  // kvserve:kv_tier_<suffix>{tier="<name>"}, and kvserve:kv_<name>_<suffix>
  const char* type;
  const char* help;
  double (*value)(const kvserve::TierStats&);
};

// Every tier reports the same figures, in blocks and bytes. Hits are blocks loaded instead of
// recomputed; corrupt ones failed a check and were recomputed. up falls to 0 when a disk tier
// turned itself off (a full, read-only or vanished directory) or Redis cannot be reached; then
// lookups count as misses and writes as dropped, and every request is computed.
constexpr TierField kTierFields[] = {
    {"up", "gauge", "1 while the tier writes and (a remote one) answers, 0 when it is off or down.",
     [](const kvserve::TierStats& t) { return t.up ? 1.0 : 0.0; }},
    {"hits_total", "counter", "KV blocks loaded from the tier.",
     [](const kvserve::TierStats& t) { return double(t.hits); }},
    {"misses_total", "counter",
     "KV blocks past the RAM prefix cache (and the tiers asked before) that the tier did not "
     "hold, or could not be asked for.",
     [](const kvserve::TierStats& t) { return double(t.misses); }},
    {"corrupt_total", "counter",
     "Stored KV blocks that failed a check (never loaded; removed and recomputed).",
     [](const kvserve::TierStats& t) { return double(t.corrupt); }},
    {"errors_total", "counter",
     "Commands or connections that failed or timed out (a local tier: writes it refused).",
     [](const kvserve::TierStats& t) { return double(t.errors); }},
    {"bytes_read_total", "counter", "Bytes of stored KV blocks read.",
     [](const kvserve::TierStats& t) { return double(t.bytes_read); }},
    {"read_seconds_total", "counter",
     "Seconds the loader spent reading, checking and copying blocks into the pool.",
     [](const kvserve::TierStats& t) { return t.read_seconds; }},
    {"bytes_written_total", "counter", "Bytes of KV blocks written (headers included).",
     [](const kvserve::TierStats& t) { return double(t.bytes_written); }},
    {"payload_bytes_written_total", "counter",
     "KV bytes in the blocks written (over bytes_written_total: the codec's compression ratio).",
     [](const kvserve::TierStats& t) { return double(t.payload_bytes_written); }},
    {"blocks_written_total", "counter", "KV blocks written.",
     [](const kvserve::TierStats& t) { return double(t.blocks_written); }},
    {"dropped_total", "counter",
     "KV blocks not written: the write queue was full, the write failed, or the tier was off.",
     [](const kvserve::TierStats& t) { return double(t.dropped); }},
    {"usage_bytes", "gauge", "Bytes the tier holds.",
     [](const kvserve::TierStats& t) { return double(t.usage_bytes); }},
    {"capacity_bytes", "gauge", "Bytes the tier may hold (--kv-disk-size).",
     [](const kvserve::TierStats& t) { return double(t.capacity_bytes); }},
};

// Each figure once, as kvserve:kv_tier_<suffix> with one series per tier (tier="disk", ...),
// so that a query sums or compares tiers; then, for the dashboards and scripts written before
// the label, the same values under each tier's own name, kvserve:kv_<tier>_<suffix>.
void RenderTierGauges(const std::vector<kvserve::TierStats>& tiers, std::string* out) {
  if (tiers.empty()) return;
  char line[512];
  for (const TierField& f : kTierFields) {
    std::snprintf(line, sizeof line, "# HELP kvserve:kv_tier_%s %s\n# TYPE kvserve:kv_tier_%s %s\n",
                  f.suffix, f.help, f.suffix, f.type);
    *out += line;
    for (const kvserve::TierStats& t : tiers) {
      if (f.value(t) < 0) continue;
      std::snprintf(line, sizeof line, "kvserve:kv_tier_%s{tier=\"%s\"} %.9g\n", f.suffix,
                    t.name.c_str(), f.value(t));
      *out += line;
    }
  }
  for (const kvserve::TierStats& t : tiers) {
    for (const TierField& f : kTierFields) {
      if (f.value(t) < 0) continue;
      const std::string name = "kv_" + t.name + "_" + f.suffix;
      const std::string help = std::string(f.help) + " The same as kvserve:kv_tier_" + f.suffix +
                               "{tier=\"" + t.name + "\"}.";
      Gauge(out, name.c_str(), f.type, help.c_str(), f.value(t));
    }
  }
}

// What clients cost the HTTP layer: a rise in timeouts or evictions is a slow or flooding
// client being shed.
void RenderHttpGauges(const http::HttpServer::Stats& connections, std::string* out) {
  Gauge(out, "http_connections_open", "gauge", "HTTP connections open.",
        static_cast<double>(connections.open));
  Gauge(out, "http_connections_timed_out_total", "counter",
        "HTTP connections closed for missing a deadline (head, body, idle, write).",
        static_cast<double>(connections.timed_out));
  Gauge(out, "http_connections_evicted_total", "counter",
        "HTTP connections closed to make room under --max-connections.",
        static_cast<double>(connections.evicted));
}

// An info metric (value 1, the level in its label), as build_info metrics are.
void RenderCpuIsaInfo(std::string* out) {
  char line[512];
  std::snprintf(line, sizeof line,
                "# HELP kvserve:cpu_isa_info The instruction-set level the kernels run at.\n"
                "# TYPE kvserve:cpu_isa_info gauge\nkvserve:cpu_isa_info{isa=\"%s\"} 1\n",
                kvserve::CpuIsa().c_str());
  *out += line;
}

}  // namespace

std::string Metrics::Render(const kvserve::EngineStats& s, const std::string& model,
                            const http::HttpServer::Stats& connections) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  const double usage =
      s.kv_blocks_total > 0 ? 1.0 - double(s.kv_blocks_free) / s.kv_blocks_total : 0.0;
  Gauge(&out, "kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", usage);
  Gauge(&out, "num_requests_running", "gauge", "Sequences running (holding KV blocks).", s.running);
  Gauge(&out, "num_requests_waiting", "gauge", "Sequences waiting to be scheduled.", s.waiting);
  Gauge(&out, "num_preemptions_total", "counter", "Preemptions (by recompute) so far.",
        static_cast<double>(s.preemptions));
  Gauge(&out, "prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
        static_cast<double>(prompt_tokens_));
  Gauge(&out, "generation_tokens_total", "counter", "Generated tokens of finished requests.",
        static_cast<double>(generation_tokens_));
  Gauge(&out, "request_success_total", "counter", "Requests answered.",
        static_cast<double>(requests_ok_));
  Gauge(&out, "request_failure_total", "counter", "Requests that failed or were cancelled.",
        static_cast<double>(requests_failed_));
  RenderCacheGauges(s, &out);
  RenderTierGauges(s.tiers, &out);
  Gauge(&out, "kv_cache_blocks_total", "gauge", "KV blocks in the pool.", s.kv_blocks_total);
  Gauge(&out, "kv_cache_blocks_free", "gauge",
        "KV blocks free to allocate (prefix-cached blocks nobody holds count: /v1/kv/state splits "
        "them).",
        s.kv_blocks_free);
  RenderHttpGauges(connections, &out);
  RenderCpuIsaInfo(&out);
  ttft_.Render("kvserve:time_to_first_token_seconds", "Time to first token.", &out);
  tpot_.Render("kvserve:time_per_output_token_seconds", "Time between output tokens.", &out);
  e2e_.Render("kvserve:e2e_request_latency_seconds", "End-to-end request latency.", &out);
  (void)model;
  return out;
}

}  // namespace kvs::server
