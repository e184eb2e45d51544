// Server metrics in the Prometheus text format, named like vLLM's with a "kvserve:" prefix.
// Thread-safe: request handlers record, the /metrics handler renders.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "kvserve/kvserve.h"
#include "server/http/http_server.h"

namespace kvs::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  // Appends the _bucket/_sum/_count lines of metric `name`.
  void Render(const std::string& name, const std::string& help, std::string* out) const;
  // The q-quantile as Prometheus's histogram_quantile estimates it (linear within the bucket
  // that holds it; the last finite bound when it falls in +Inf); 0 with no observations.
  double Quantile(double q) const;
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bound, not cumulative; the last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  void RecordRequest(int64_t prompt_tokens, int64_t generation_tokens, double e2e_s, bool ok);
  // At a request's first token, not its end (as vLLM): a stream's TTFT shows while it runs.
  void RecordTimeToFirstToken(double seconds);
  void RecordInterTokenGap(double seconds);  // time per output token, one per gap
  std::string Render(const kvserve::EngineStats& engine, const std::string& model,
                     const http::HttpServer::Stats& connections = {}) const;

  // The request figures the dashboard shows (GET /v1/kv/state), from the same records.
  struct Summary {
    int64_t prompt_tokens = 0, generation_tokens = 0, requests_ok = 0, requests_failed = 0;
    double ttft_p50 = 0, ttft_p90 = 0, ttft_p99 = 0;  // seconds
    double itl_p50 = 0, itl_p90 = 0, itl_p99 = 0;
  };
  Summary Summarize() const;

 private:
  mutable std::mutex mu_;
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0, requests_ok_ = 0, requests_failed_ = 0;
  Histogram ttft_, tpot_, e2e_;
};

}  // namespace kvs::server
